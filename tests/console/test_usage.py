"""The console's Usage page and a job's own usage (issue 47, item 5), in headless Chromium against
the gateway under test: real jobs run with the local runner, so the ledger has records with run
time and the runner's default allocation; budgets are set with `gantry admin set-budget`."""

import datetime
import re

import pytest
from conftest import BASE, FUNCTION, OUT, PROVIDER, PROVIDER_ADMIN, Api, gantry_admin, sign_in
from playwright.sync_api import expect

MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]


def this_month() -> str:
    today = datetime.datetime.now(datetime.timezone.utc).date()
    return f"{MONTHS[today.month - 1]} {today.year}"


def previous_month() -> str:
    first = datetime.datetime.now(datetime.timezone.utc).date().replace(day=1)
    last = first - datetime.timedelta(days=1)
    return f"{MONTHS[last.month - 1]} {last.year}"


def total(page, key: str):
    return page.locator(f'#usage-totals [data-total="{key}"] dd')


def test_usage_page_shows_totals_a_chart_by_function_and_the_groups(page, user):
    other = "console-other"
    user.upload_function(title=other)
    jobs = [user.run(n=1, pause=0), user.run(n=2, pause=0.5), user.run(title=other, n=1, pause=0)]
    for job_id in jobs:
        assert user.wait(job_id) == "SUCCEEDED"
    answer = user.get("usage/")
    assert answer["total"]["jobs"] == 3, answer
    sign_in(page, user.token)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Usage").click()
    expect(page.get_by_role("heading", name="Usage", exact=True)).to_be_visible()
    expect(page.get_by_role("navigation", name="Main").get_by_role("link", name="Usage")).to_have_attribute("aria-current", "page")
    # This month by default, with its totals as the gateway counts them, in human units.
    expect(page.locator("#usage-period")).to_have_text(this_month())
    expect(total(page, "jobs")).to_have_text("3")
    expect(total(page, "running")).to_have_text("0")
    expect(total(page, "run")).to_have_text(re.compile(r"^[0-9.]+ s$|min"))
    cpu_hours = answer["total"]["cpu_core_seconds"] / 3600
    assert cpu_hours > 0, answer
    shown = float(total(page, "cpu-hours").text_content())
    assert abs(shown - cpu_hours) <= cpu_hours * 0.05 + 1e-9, (shown, cpu_hours)
    # The chart: an SVG with its title and description, one bar per function that ran today,
    # named in the legend; the numbers are in the table as well.
    chart = page.locator("#usage-chart svg.chart")
    expect(chart).to_have_attribute("role", "img")
    expect(chart.locator("title").first).to_contain_text("CPU-hours per day in")
    expect(chart.locator("desc")).to_contain_text("stacked by function")
    bars = chart.locator("rect.bar")
    expect(bars).to_have_count(2)
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    assert {bars.nth(i).get_attribute("data-function") for i in range(2)} == {FUNCTION, other}
    assert {bars.nth(i).get_attribute("data-day") for i in range(2)} == {today}
    legend = page.locator("#usage-legend")
    expect(legend.locator(f'li[data-function="{FUNCTION}"]')).to_be_visible()
    expect(legend.locator(f'li[data-function="{other}"]')).to_be_visible()
    page.get_by_text("The chart's numbers as a table").click()
    expect(page.locator("table.chart-table tbody tr")).to_have_count(1)
    expect(page.locator("table.chart-table tbody th")).to_have_text(today)
    # The table by function: jobs of each, and the total.
    table = page.locator("#usage-table table")
    expect(table.locator("tbody tr")).to_have_count(2)
    expect(table.locator("tbody tr", has_text=FUNCTION).locator("td").first).to_have_text("2")
    expect(table.locator("tbody tr", has_text=other).locator("td").first).to_have_text("1")
    expect(table.locator("tfoot td").first).to_have_text("3")
    # No budget set: none shown.
    expect(page.locator("#usage-budgets")).to_be_hidden()
    page.screenshot(path=str(OUT / "console-usage.png"), full_page=True)
    # By day, and by size.
    page.get_by_label("Group the table by").select_option("day")
    expect(page.locator("#usage-table table tbody tr")).to_have_count(1)
    expect(page.locator("#usage-table table tbody th")).to_have_text(today)
    assert "group_by=day" in page.url
    page.get_by_label("Group the table by").select_option("size")
    expect(page.locator("#usage-table table tbody th")).to_have_text("(no size asked)")
    # The bars can show run time instead; the chart keeps its two bars.
    page.get_by_label("Bars show").select_option("run")
    expect(page.locator("#usage-chart svg.chart title").first).to_contain_text("Run time per day")
    expect(page.locator("#usage-chart rect.bar")).to_have_count(2)
    # The month before: empty days, no bars, said in words.
    page.get_by_role("link", name=re.compile(f"^← {previous_month()}$")).click()
    expect(page.locator("#usage-period")).to_have_text(previous_month())
    expect(total(page, "jobs")).to_have_text("0")
    expect(page.locator("#usage-table")).to_contain_text("No jobs ended or ran in this period.")
    expect(page.locator("#usage-chart svg.chart desc")).to_contain_text("every day is empty")
    expect(page.locator("#usage-chart rect.bar")).to_have_count(0)
    page.get_by_role("link", name="This month").click()
    expect(page.locator("#usage-period")).to_have_text(this_month())
    expect(total(page, "jobs")).to_have_text("3")


def test_usage_page_draws_the_budget_as_a_line_and_shows_its_use(page, user):
    job_id = user.run(n=1, pause=0)
    assert user.wait(job_id) == "SUCCEEDED"
    gantry_admin("set-budget", "--user", user.token, "--cpu-hours", "10")
    budgets = user.get("jobs/queue/", limit=0)["budgets"]
    assert [b["cpu_hours"] for b in budgets] == [10.0], budgets
    sign_in(page, user.token)
    page.goto(f"{BASE}/console/#/usage")
    box = page.locator("#usage-budgets")
    expect(box).to_be_visible()
    expect(box.locator(".budgets li")).to_contain_text(f"CPU-hours budget of user {user.token}:")
    expect(box.locator(".budgets li")).to_contain_text("of 10 used in")
    expect(box.locator("meter")).to_have_attribute("max", "10")
    # The month's running total against the budget: a horizontal line at 10 CPU-hours, labelled.
    chart = box.locator('svg.budget-chart[data-kind="CPU"]')
    expect(chart).to_have_attribute("role", "img")
    line = chart.locator(".budget-line")
    expect(line).to_have_count(1)
    expect(line).to_have_attribute("data-limit", "10")
    expect(line.locator("text")).to_have_text("Budget: 10 CPU-hours")
    expect(line).to_have_attribute("data-budget", f"user {user.token}")
    expect(line.locator("title")).to_have_text(f"Budget of user {user.token}: 10 CPU-hours a month")
    expect(chart.locator(".used-line polyline")).to_have_count(1)
    expect(chart.locator("desc")).to_contain_text("budget is 10 CPU-hours a month")
    expect(box).to_contain_text("A budget is a calendar month's")
    page.screenshot(path=str(OUT / "console-usage-budget.png"), full_page=True)
    # Another month: the budget's use is this month's, so no line; a link back to its month.
    page.get_by_role("link", name=re.compile(f"^← {previous_month()}$")).click()
    expect(page.locator("#usage-period")).to_have_text(previous_month())
    expect(box.locator("#budget-elsewhere")).to_contain_text("when the period shown is its month")
    expect(box.locator("svg.budget-chart")).to_have_count(0)


def test_a_jobs_page_shows_its_usage_so_far_then_its_record(page, user):
    job_id = user.run(mode="ticks", n=16, pause=0.5)
    user.wait(job_id, {"RUNNING"})
    sign_in(page, user.token)
    page.goto(f"{BASE}/console/#/job/{job_id}")
    section = page.locator("#job-usage")
    expect(page.locator("#job-usage-state")).to_have_text("so far")
    expect(section.locator('[data-usage="run"]')).to_contain_text("so far")
    expect(section.locator('[data-usage="given"]')).to_contain_text("core")
    page.screenshot(path=str(OUT / "console-job-usage-running.png"), full_page=True)
    expect(page.locator("#job-status .badge")).to_have_text("SUCCEEDED")
    expect(page.locator("#job-usage-state")).to_have_text("final")
    expect(section.locator('[data-usage="run"]')).not_to_contain_text("so far")
    usage = user.get(f"jobs/{job_id}/usage/")
    assert usage["ended"] and usage["run_seconds"] > 0, usage
    seconds = float(section.locator('[data-usage="cpu-hours"]').get_attribute("title").split()[0])
    assert abs(seconds - usage["cpu_core_seconds"]) < 1e-6, (seconds, usage)
    shown = float(section.locator('[data-usage="cpu-hours"]').text_content())
    assert abs(shown - usage["cpu_core_seconds"] / 3600) <= usage["cpu_core_seconds"] / 3600 * 0.05, shown


def test_usage_error_answers_are_shown_and_a_provider_admin_reads_the_providers(page, user):
    sign_in(page, user.token)
    # A period that ends before it starts: the gateway's 400, as sent, and not asked again.
    page.goto(f"{BASE}/console/#/usage")
    expect(page.locator("#usage-period")).to_have_text(this_month())
    page.get_by_label("From", exact=True).fill("2026-03-10")
    page.get_by_label("To", exact=True).fill("2026-03-05")
    page.get_by_role("button", name="Show").click()
    expect(page.get_by_role("alert")).to_have_text("'to' (2026-03-06) must be after 'from' (2026-03-10).")
    expect(page.locator(".freshness")).to_have_attribute("data-state", "stopped")
    expect(page.locator(".freshness")).to_contain_text("The gateway answered 400 Bad Request")
    # Someone else's provider: 403, as sent.
    page.goto(f"{BASE}/console/#/usage?provider={PROVIDER}")
    expect(page.get_by_role("alert")).to_have_text(f"Only an admin of provider {PROVIDER} reads its usage.")
    # Its admin reads every user's jobs of its functions.
    admin = Api(PROVIDER_ADMIN)
    admin.upload_function(title=f"{PROVIDER}/usage-tool")
    job_id = admin.run(title="usage-tool", provider=PROVIDER, n=1, pause=0)
    admin.wait(job_id)
    page.get_by_role("button", name="Sign out").click()
    sign_in(page, PROVIDER_ADMIN)
    # Found from the function's page.
    page.goto(f"{BASE}/console/#/function?title=usage-tool&provider={PROVIDER}")
    page.get_by_role("link", name=f"{PROVIDER} usage").click()
    expect(page.get_by_role("heading", name=f"Usage of provider {PROVIDER}")).to_be_visible()
    assert f"provider={PROVIDER}" in page.url, page.url
    expect(page.locator("#usage-table tbody tr", has_text="usage-tool")).to_be_visible()
    expect(page.locator('#usage-chart rect.bar[data-function="usage-tool"]')).not_to_have_count(0)


@pytest.mark.viewport(400, 860)
def test_usage_page_at_400_px(page, user):
    job_id = user.run(n=1, pause=0)
    user.wait(job_id)
    sign_in(page, user.token)
    page.goto(f"{BASE}/console/#/usage")
    expect(page.locator("#usage-chart rect.bar")).to_have_count(1)
    page.wait_for_load_state("networkidle")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 400, f"the Usage page is {width} px wide"
    box = page.locator("#usage-chart svg.chart").bounding_box()
    assert box and box["width"] <= 400 and box["height"] > 100, box
    unlabelled = page.evaluate(
        """[...document.querySelectorAll('main input, main select, main textarea')]
           .filter(c => !(c.labels && c.labels.length) && !c.getAttribute('aria-label'))
           .map(c => c.name)"""
    )
    assert unlabelled == [], unlabelled
    page.screenshot(path=str(OUT / "console-usage-400px.png"), full_page=True)
