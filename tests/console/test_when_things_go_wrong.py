"""What a user sees in the console when something goes wrong (issue 30): a gateway stopped and
started under open pages, the queue's limits, pages past the end and unknown names, the run form's
start, a stop asked for twice, a job that does not exist, upload errors by their fields, and a
failed job's reason at the top of its page."""

import json
import re
import time

import pytest
import requests
from conftest import (
    BASE,
    FUNCTION,
    OUT,
    Api,
    assert_not_reloaded,
    mark_page,
    new_user,
    sign_in,
)
from playwright.sync_api import expect

# A page must recover within this long after the gateway is back (the bound).
RECOVERY_MS = 10_000


def status_badge(page):
    return page.locator("#job-status .badge")


def freshness(page):
    return page.locator(".freshness")


def test_pages_show_the_outage_and_recover_by_themselves_when_the_gateway_restarts(context, own_gateway):
    token = new_user("restart")
    api = Api(token, base=own_gateway.base)
    api.upload_function()
    # A job that writes a line every second for a minute.
    ticking = api.run(mode="ticks", n=60, pause=1.0)
    api.wait(ticking, {"RUNNING"})
    base = own_gateway.base
    pages = {}
    for name, route in [("jobs", "#/jobs"), ("job", f"#/job/{ticking}"), ("queue", "#/queue")]:
        page = context.new_page()
        sign_in(page, token, base=base)
        page.goto(f"{base}/console/{route}")
        expect(freshness(page)).to_have_attribute("data-state", "live")
        mark_page(page)
        pages[name] = page
    job_page = pages["job"]
    expect(job_page.locator("#log")).to_contain_text("tick 2")
    expect(job_page.locator("#log-state")).to_have_attribute("data-state", "live")

    # SIGTERM: the live streams end at once (a `restarting` event), long before the end of the
    # server's 60 s grace, and the server, with nothing else in flight, ends soon after.
    own_gateway.terminate()
    expect(job_page.locator("#log-state")).not_to_have_attribute("data-state", "live", timeout=5_000)
    own_gateway.wait_stopped()
    # Every page says the gateway cannot be reached, since when, and that it retries; the data
    # it still shows is marked stale.
    for name, page in pages.items():
        expect(freshness(page)).to_have_attribute("data-state", "retrying", timeout=RECOVERY_MS)
        expect(freshness(page)).to_contain_text("Retrying")
        expect(freshness(page)).to_contain_text("Last heard from the gateway at")
    expect(pages["jobs"].locator(".table-wrap")).to_have_attribute("data-stale", "true")
    # A view first opened while the gateway is down says so too.
    opened_down = pages["queue"]
    opened_down.goto(f"{base}/console/#/jobs?status=RUNNING")
    expect(freshness(opened_down)).to_have_attribute("data-state", "retrying", timeout=RECOVERY_MS)
    expect(freshness(opened_down)).to_contain_text("Nothing has been heard from the gateway yet")
    for page in pages.values():
        page.screenshot(path=str(OUT / f"gateway-down-{page.url.split('#/')[-1].split('/')[0].split('?')[0]}.png"))

    own_gateway.start()
    for name, page in pages.items():
        expect(freshness(page)).to_have_attribute("data-state", "live", timeout=RECOVERY_MS)
        assert_not_reloaded(page)
    # The data is current again: the list shows the running job, the job's log goes on live.
    expect(opened_down.locator(f'tr[data-job="{ticking}"]')).to_be_visible()
    expect(pages["jobs"].locator(".table-wrap")).not_to_have_attribute("data-stale", "true")
    expect(job_page.locator("#log-state")).to_have_attribute("data-state", "live", timeout=RECOVERY_MS)
    seen = job_page.locator("#log").text_content()
    last = max(int(n) for n in re.findall(r"tick (\d+)", seen))
    expect(job_page.locator("#log")).to_contain_text(f"tick {last + 3}")
    text = job_page.locator("#log").text_content()
    for i in range(last + 3):
        assert text.count(f"tick {i}\n") == 1, (i, text)
    api.post(f"jobs/{ticking}/stop/", json={})
    expect(status_badge(job_page)).to_have_text("STOPPED")


def test_the_queue_shows_the_running_limit_holding_two_queued_jobs(page, user):
    sleepers = [user.run(mode="sleep", n=1) for _ in range(4)]
    try:
        for job_id in sleepers[:2]:
            user.wait(job_id, {"RUNNING"})
        sign_in(page, user.token)
        page.get_by_role("navigation", name="Main").get_by_role("link", name="Queue").click()
        expect(page.locator("#running-limit")).to_contain_text("2 of 2")
        expect(page.locator("#running-limit")).to_contain_text("your limit")
        expect(page.locator("#queue-limits")).to_contain_text("CPU slots:")
        for place, job_id in enumerate(sleepers[2:]):
            row = page.locator(f'tr[data-job="{job_id}"]')
            expect(row.locator(".waiting-for")).to_have_text("Your limit of 2 jobs running at once")
            expect(row).to_contain_text(FUNCTION)
            expect(row.locator(".position")).to_have_text(re.compile(r"^\d+ \(\d+ ahead\)$"))
        positions = [
            int(page.locator(f'tr[data-job="{job_id}"] .position').text_content().split()[0]) for job_id in sleepers[2:]
        ]
        assert positions[0] < positions[1], positions
        for job_id in sleepers[:2]:
            expect(page.locator(f'tr[data-job="{job_id}"] .waiting-for')).to_have_text("Started")
        page.screenshot(path=str(OUT / "console-queue.png"))
        # A queued job's own page: its place in the queue and what holds it back, linked to
        # the queue (not just "not started yet").
        page.locator(f'tr[data-job="{sleepers[3]}"] a').click()
        place = page.locator("#job-queue")
        expect(place.locator(".position")).to_have_text(re.compile(r"^\d+(st|nd|rd|th) in the queue$"))
        ahead = positions[1] - 1
        expect(place).to_contain_text(f"({ahead} queued {'job' if ahead == 1 else 'jobs'} of any user ahead of it)")
        expect(place.locator(".waiting-for")).to_have_text("Held back by: Your limit of 2 jobs running at once.")
        expect(page.locator("#job-timing")).to_have_text("not started yet")
        page.screenshot(path=str(OUT / "console-queued-job.png"))
        page.locator("#job-queue-link").click()
        expect(page.get_by_role("heading", name="Queue")).to_be_visible()
        # Once it runs, the place goes.
        page.go_back()
        for job_id in sleepers[:3]:
            user.post(f"jobs/{job_id}/stop/", json={})
        expect(status_badge(page)).to_have_text("RUNNING")
        expect(page.locator("#job-queue")).to_be_hidden()
    finally:
        for job_id in sleepers:
            user.post(f"jobs/{job_id}/stop/", json={})


def test_the_jobs_list_past_the_end_with_an_unknown_function_and_the_picker(page, user):
    jobs = [user.run(n=1, pause=0) for _ in range(3)]
    for job_id in jobs:
        user.wait(job_id)
    sign_in(page, user.token)
    page.goto(f"{BASE}/console/#/jobs?offset=500")
    pager = page.locator(".pager")
    expect(pager).to_contain_text("3 jobs in all")
    expect(page.locator("#no-jobs")).to_contain_text("past the last one")
    page.get_by_role("link", name="Go to the last page").click()
    expect(page.locator(".pager .range")).to_have_text("1–3 of 3")
    # No Size column (the listing has no size to show).
    expect(page.locator("table.jobs thead th")).to_have_text(["Job", "Function", "Status", "Created", "Updated"])
    # The function picker offers the caller's functions; a name no function has says so, in
    # the console's words, and links to the functions.
    expect(page.locator(f'datalist option[value="{FUNCTION}"]')).to_have_count(1)
    page.get_by_label("Function", exact=True).fill("no-such-function")
    page.get_by_role("button", name="Apply").click()
    expect(page.locator("#no-jobs")).to_contain_text("No function's name contains “no-such-function”.")
    expect(page.locator("#no-jobs").get_by_role("link", name="See the functions you can run")).to_be_visible()
    expect(page.locator('.table-wrap [role="alert"]')).to_have_count(0)
    expect(page.locator(".pager")).to_be_hidden()
    page.get_by_label("Function", exact=True).fill(FUNCTION)
    page.get_by_role("button", name="Apply").click()
    expect(page.locator(".pager .range")).to_have_text("1–3 of 3")
    # The date field shows its whole value at 1280 px.
    page.set_viewport_size({"width": 1280, "height": 800})
    after = page.get_by_label("Created after")
    after.fill("2024-05-01T10:00")
    width = after.evaluate("e => e.getBoundingClientRect().width")
    assert width >= 210, f"the date field is {width} px wide"


def test_the_run_form_starts_neutral_and_the_job_shows_its_arguments(page, user):
    sign_in(page, user.token)
    page.goto(f"{BASE}/console/#/function?title={FUNCTION}")
    arguments = page.get_by_label("Arguments (JSON object)")
    # A template from the schema's properties, required ones first; nothing red, nothing read out.
    expect(arguments).to_have_value(json.dumps({"n": 1, "mode": "ok", "pause": 0}, indent=2))
    expect(arguments).not_to_have_attribute("aria-invalid", "true")
    expect(page.locator('#arguments-check [role="alert"]')).to_have_count(0)
    # Tabbing in selects the template, so typing replaces it.
    page.get_by_label("Size").focus()
    page.keyboard.press("Shift+Tab")
    expect(arguments).to_be_focused()
    selection = arguments.evaluate("e => [e.selectionStart, e.selectionEnd, e.value.length]")
    assert selection[0] == 0 and selection[1] == selection[2], selection
    page.keyboard.type('{"n": 2, "pause": 0.1}')
    expect(arguments).to_have_value('{"n": 2, "pause": 0.1}')
    expect(page.locator("#arguments-check")).to_contain_text("match")
    page.get_by_role("button", name="Run").click()
    expect(page).to_have_url(re.compile(r"#/job/[0-9a-f-]{36}$"))
    expect(page.locator("#job-arguments")).to_contain_text('"pause": 0.1')
    expect(status_badge(page)).to_have_text("SUCCEEDED")
    expect(page.locator("#stop-button")).to_be_hidden()
    job_id = page.url.rsplit("/", 1)[-1]
    # Only the author reads them: anyone else is told the job is not theirs.
    other = Api(new_user("other"))
    answer = other.session.get(other.url(f"jobs/{job_id}/arguments/"), timeout=10)
    assert answer.status_code == 404, answer.text
    assert answer.json()["message"].startswith(f"Job [{job_id}] not found"), answer.text


def test_a_missing_job_offers_a_way_back_and_upload_errors_stand_by_their_fields(page, user, tmp_path):
    sign_in(page, user.token)
    missing = "00000000-0000-4000-8000-000000000000"
    page.goto(f"{BASE}/console/#/job/{missing}")
    expect(page.get_by_role("alert")).to_contain_text(f"Job [{missing}] not found")
    page.get_by_role("link", name="Back to the jobs").click()
    expect(page).to_have_url(re.compile(r"#/jobs$"))
    page.goto(f"{BASE}/console/#/upload")
    page.get_by_label("Arguments schema (JSON Schema, optional)").fill("{not json")
    page.get_by_role("button", name="Upload", exact=True).click()
    expect(page.locator("#upload-title-check")).to_contain_text("A title is required.")
    expect(page.locator("#upload-artifact-check")).to_contain_text("Choose a .tar archive.")
    expect(page.locator("#upload-arguments_schema-check")).to_contain_text("not valid JSON")
    expect(page.get_by_label("Title")).to_have_attribute("aria-invalid", "true")
    expect(page.get_by_label("Title")).to_be_focused()
    # The gateway's own refusal stands by the field it is about.
    archive = tmp_path / "not-a-tar.tar"
    archive.write_bytes(b"this is not a tar archive")
    page.get_by_label("Title").fill("broken-upload")
    page.get_by_label("Archive (.tar)").set_input_files(str(archive))
    page.get_by_label("Arguments schema (JSON Schema, optional)").fill("")
    page.get_by_role("button", name="Upload", exact=True).click()
    expect(page.locator("#upload-artifact-check [role=alert]")).to_be_visible()
    expect(page.locator("#upload-title-check")).to_be_empty()


def test_a_failed_job_shows_its_reason_with_the_exception_line_at_the_top(page, user):
    """The README's picture of a job's page: a Python failure, its reason first, then the log with
    paths of the function's folder (never the server's)."""
    job_id = user.run(mode="divide", n=1)
    assert user.wait(job_id) == "FAILED"
    why = "exit code 1: ZeroDivisionError: division by zero"
    assert user.get(f"jobs/{job_id}/", with_result="false")["status_reason"] == why
    sign_in(page, user.token)
    page.goto(f"{BASE}/console/#/job/{job_id}")
    expect(status_badge(page)).to_have_text("FAILED")
    reason = page.locator("#job-reason")
    expect(reason).to_have_text(f"FAILED: {why}")
    log = page.locator("#log")
    expect(log).to_contain_text('File "main.py", line')
    expect(log).to_contain_text("ZeroDivisionError: division by zero")
    assert "/jobs/" not in log.text_content(), "the log names a server path"
    # At the top: above the timeline, the log and the result.
    top = reason.bounding_box()["y"]
    for below in ("#events", "#log"):
        assert top < page.locator(below).bounding_box()["y"], below
    page.screenshot(path=str(OUT / "console-job.png"))


def test_the_function_filter_matches_part_of_a_name_in_any_case(page, user, recorder):
    """The console's function filter looks for what was typed in the names of the functions the
    user can see, in any case, and lists their jobs (merged, newest first, in pages); the API's
    own `function=` stays exact, with its message."""
    user.upload_function(title="my-DEMO-tool")
    demo = [user.run(n=1, pause=0) for _ in range(6)]
    tool = [user.run(title="my-DEMO-tool", n=1, pause=0) for _ in range(5)]
    for job_id in demo + tool:
        user.wait(job_id)
    newest_first = [job["id"] for job in user.get("jobs/", limit=20)["results"]]
    assert set(newest_first) == set(demo + tool), newest_first
    sign_in(page, user.token)
    function = page.get_by_label("Function", exact=True)
    # Part of one name, in another case: that function's jobs, and a line saying which.
    function.fill("CONSOLE-DE")
    page.get_by_role("button", name="Apply").click()
    expect(page.locator("#function-match")).to_contain_text(f"Jobs of {FUNCTION}, the function whose name contains “CONSOLE-DE”.")
    expect(page.locator(".pager .range")).to_have_text("1–6 of 6")
    expect(page.locator("table.jobs tbody tr")).to_have_count(6)
    # Part of two names: both functions' jobs, newest first, in pages.
    function.fill("demo")
    page.get_by_role("button", name="Apply").click()
    expect(page.locator("#function-match")).to_contain_text("the 2 functions whose names contain “demo”")
    expect(page.locator(".pager .range")).to_have_text("1–10 of 11")
    rows = page.locator("table.jobs tbody tr")
    expect(rows).to_have_count(10)
    assert [rows.nth(i).get_attribute("data-job") for i in range(10)] == newest_first[:10]
    page.get_by_role("link", name="Next").click()
    expect(page.locator(".pager .range")).to_have_text("11–11 of 11")
    expect(rows).to_have_count(1)
    assert rows.first.get_attribute("data-job") == newest_first[10]
    page.get_by_role("button", name="Previous").click()
    expect(page.locator(".pager .range")).to_have_text("1–10 of 11")
    assert [rows.nth(i).get_attribute("data-job") for i in range(10)] == newest_first[:10]
    # Nothing matches: said plainly, with the way to the functions.
    function.fill("xyz")
    page.get_by_role("button", name="Apply").click()
    expect(page.locator("#no-jobs")).to_have_text(
        "No function's name contains “xyz”. See the functions you can run, or show the jobs of every function."
    )
    # The console never asked the gateway for a function by a part of its name.
    asked = [url for url in recorder.urls("/api/v1/jobs/?") if "function=" in url]
    assert asked and all(re.search(r"function=(console-demo|my-DEMO-tool)(&|$)", url) for url in asked), asked
    # The API itself is unchanged: exact, with its own message.
    answer = requests.get(
        f"{BASE}/api/v1/jobs/", params={"function": "console-de"}, headers={"Authorization": f"Bearer {user.token}"}, timeout=10
    )
    assert answer.status_code == 404 and answer.json()["message"] == "Qiskit Function console-de doesn't exist.", answer.text
    page.screenshot(path=str(OUT / "console-jobs-function-filter.png"))


def test_a_new_users_empty_jobs_page_points_to_the_functions(page):
    sign_in(page, new_user("newcomer"))
    empty = page.locator("#no-jobs")
    expect(empty).to_contain_text("You have no jobs yet.")
    expect(empty).to_contain_text("press Run")
    # No pager that leads nowhere.
    expect(page.locator(".pager")).to_be_hidden()
    expect(page.get_by_role("link", name="Previous")).to_have_count(0)
    page.screenshot(path=str(OUT / "console-jobs-empty.png"))
    empty.get_by_role("link", name="Functions").click()
    expect(page.get_by_role("heading", name="Functions")).to_be_visible()


def test_an_error_answer_is_shown_with_its_status_and_not_asked_forever(page, user, recorder):
    sign_in(page, user.token)
    # A refusal (400): the status and the gateway's message, asked once, and a Retry button.
    message = requests.get(
        f"{BASE}/api/v1/jobs/", params={"created_after": "garbage"}, headers={"Authorization": f"Bearer {user.token}"}, timeout=10
    ).json()["message"]
    page.goto(f"{BASE}/console/#/jobs?created_after=garbage")
    line = freshness(page)
    expect(line).to_have_attribute("data-state", "stopped")
    expect(line).to_contain_text(f"The gateway answered 400 Bad Request: {message.rstrip('.')}.")
    expect(line).not_to_contain_text("Nothing has been heard")
    expect(line.get_by_role("button", name="Retry")).to_be_visible()
    expect(page.locator(".table-wrap [role=alert]")).to_have_text(message)
    reads = len(recorder.urls("/api/v1/jobs/?"))
    page.wait_for_timeout(4000)
    assert len(recorder.urls("/api/v1/jobs/?")) == reads, "a refused read was asked again"

    # A server error (500): asked again a few times, further apart, then no more; Retry asks again.
    failing = {"on": True}

    def answer(route):
        if failing["on"]:
            route.fulfill(status=500, content_type="application/json", body=json.dumps({"message": "The database is unavailable."}))
        else:
            route.continue_()

    page.route(re.compile(r"/api/v1/jobs/queue/"), answer)
    started = time.monotonic()
    page.goto(f"{BASE}/console/#/queue")
    expect(line).to_contain_text("The gateway answered 500 Internal Server Error: The database is unavailable.")
    expect(line).to_contain_text("Asking again in 3 s (1 of 3)")
    expect(line).to_have_attribute("data-state", "stopped", timeout=40_000)
    waited = time.monotonic() - started
    assert 18 <= waited, f"gave up after {waited:.1f} s"
    asked = len(recorder.urls("/api/v1/jobs/queue/?limit=100"))
    assert asked == 4, f"{asked} reads of the queue"
    page.wait_for_timeout(4000)
    assert len(recorder.urls("/api/v1/jobs/queue/?limit=100")) == asked
    page.screenshot(path=str(OUT / "console-error-answer.png"))
    failing["on"] = False
    line.get_by_role("button", name="Retry").click()
    expect(line).to_have_attribute("data-state", "live")
    expect(page.locator("#slots-used")).to_be_visible()
    page.unroute(re.compile(r"/api/v1/jobs/queue/"))


@pytest.mark.viewport(400, 740)
def test_at_400_px_the_filters_fold_and_the_first_job_is_on_the_first_screen(page, user):
    job_id = user.run(n=1, pause=0)
    user.wait(job_id)
    sign_in(page, user.token)
    first = page.locator("table.jobs tbody tr").first
    expect(first).to_have_attribute("data-job", job_id)
    box = first.bounding_box()
    assert box["y"] + box["height"] <= 740, f"the first job's row ends at {box['y'] + box['height']} px"
    toggle = page.get_by_role("button", name="Filters")
    expect(toggle).to_have_attribute("aria-expanded", "false")
    expect(page.get_by_label("Status")).to_be_hidden()
    page.screenshot(path=str(OUT / "console-jobs-400px.png"))
    toggle.click()
    expect(toggle).to_have_attribute("aria-expanded", "true")
    expect(page.get_by_label("Status")).to_be_visible()
    page.get_by_label("Status").select_option("SUCCEEDED")
    page.get_by_role("button", name="Apply").click()
    # The toggle says how many filters are set; the jobs still come first.
    expect(page.get_by_role("button", name="Filters (1)")).to_have_attribute("aria-expanded", "false")
    expect(first).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= 400
