"""The web console in headless Chromium against a running `gantry serve`: what a user sees and
does, end to end. Each test saves a screenshot (conftest.py); after each, no request may have
carried a token in its URL and every console file must have come with the policy."""

import json
import re
from urllib.parse import parse_qs, urlparse

import pytest
import requests
from conftest import (
    BASE,
    FUNCTION,
    OUT,
    PROVIDER,
    PROVIDER_ADMIN,
    TOKENS,
    Api,
    assert_not_reloaded,
    function_tar,
    mark_page,
    new_user,
    sign_in,
)
from playwright.sync_api import expect

FIRST_LOAD_BUDGET = 150 * 1024


def status_badge(page):
    return page.locator("#job-status .badge")


def open_job(page, job_id):
    page.goto(f"{BASE}/console/#/job/{job_id}")
    expect(page.locator("h1")).to_contain_text(job_id)


def test_root_redirects_and_console_files_carry_the_policy(page):
    answer = page.goto(f"{BASE}/")
    assert urlparse(page.url).path == "/console/", page.url
    headers = answer.all_headers()
    policy = headers["content-security-policy"]
    for part in ["default-src 'none'", "script-src 'self'", "style-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"]:
        assert part in policy, policy
    assert "unsafe" not in policy, policy
    assert headers["x-frame-options"] == "DENY"
    assert headers["x-content-type-options"] == "nosniff"
    expect(page.get_by_label("API token")).to_be_visible()
    # No inline script or style in the page itself.
    html = page.content()
    assert "<script>" not in html and " style=" not in html


def test_first_page_load_is_under_the_budget(context, recorder):
    page = context.new_page()
    recorder.attach(page)
    page.goto(f"{BASE}/console/")
    expect(page.get_by_label("API token")).to_be_visible()
    page.wait_for_load_state("networkidle")
    sizes = {response.url: len(response.body()) for response in recorder.responses}
    total = sum(sizes.values())
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "first-load.json").write_text(json.dumps({"total_bytes": total, "files": sizes}, indent=2))
    print(f"first load: {total} bytes in {len(sizes)} files")
    assert any(url.endswith("/console/js/app.js") for url in sizes), sizes
    assert total < FIRST_LOAD_BUDGET, f"first load {total} bytes: {sizes}"
    page.screenshot(path=str(OUT / "test_first_page_load_is_under_the_budget.png"))
    assert not recorder.problems, recorder.problems


def test_sign_in_shows_the_gateways_401_message_and_sign_out_forgets_the_token(page):
    bad = "not-a-valid!token"
    TOKENS.append(bad)
    refused = requests.get(f"{BASE}/api/v1/jobs/", headers={"Authorization": f"Bearer {bad}"}, timeout=10)
    assert refused.status_code == 401
    message = refused.json()["detail"]

    page.goto(f"{BASE}/console/")
    page.get_by_label("API token").fill(bad)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_have_text(message)
    assert page.evaluate("sessionStorage.length") == 0

    good = new_user("signin")
    page.get_by_label("API token").fill(good)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("heading", name="Jobs")).to_be_visible()
    assert page.evaluate("Object.values(sessionStorage)") == [good]
    assert page.evaluate("localStorage.length") == 0
    assert page.context.cookies() == []
    # A reload keeps the session (same tab); sign out forgets it.
    page.reload()
    expect(page.get_by_role("heading", name="Jobs")).to_be_visible()
    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_label("API token")).to_be_visible()
    assert page.evaluate("sessionStorage.length") == 0
    page.reload()
    expect(page.get_by_label("API token")).to_be_visible()


def test_upload_then_run_from_the_form_with_live_validation_status_and_log(page, recorder, tmp_path):
    token = new_user("run")
    sign_in(page, token)
    # Upload from a tar file, with an arguments schema.
    # (The empty jobs page of a new user links to Functions too: the navigation's link.)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Functions").click()
    page.get_by_role("link", name="Upload a function").click()
    archive = tmp_path / "console-form.tar"
    archive.write_bytes(function_tar())
    page.get_by_label("Title").fill("console-form")
    page.get_by_label("Archive (.tar)").set_input_files(str(archive))
    page.get_by_label("Version").fill("1.2.0")
    page.get_by_label("Description").fill("Counts to n, slowly.")
    page.get_by_label("Arguments schema (JSON Schema, optional)").fill(json.dumps(
        {"type": "object", "properties": {"n": {"type": "integer"}, "pause": {"type": "number"}}, "required": ["n"]}
    ))
    page.get_by_role("button", name="Upload", exact=True).click()

    # The function's page: its details, then the run form.
    expect(page.get_by_role("heading", name="console-form", exact=True)).to_be_visible()
    facts = page.locator("dl.facts")
    expect(facts).to_contain_text("main.py")
    expect(facts).to_contain_text("1.2.0")
    expect(facts).to_contain_text("Counts to n, slowly.")
    expect(page.get_by_label("Arguments schema")).to_contain_text('"required"')
    arguments = page.get_by_label("Arguments (JSON object)")
    check = page.locator("#arguments-check")
    # The form starts neutral, from a template of the schema's properties (required first).
    expect(arguments).to_have_value('{\n  "n": 0,\n  "pause": 0\n}')
    expect(arguments).not_to_have_attribute("aria-invalid", "true")
    expect(check.locator('[role="alert"]')).to_have_count(0)
    arguments.fill('{"n": "three"}')
    expect(check.locator(".check-message")).to_contain_text("three")
    expect(check.locator(".check-path code")).to_have_text("/n")
    expect(arguments).to_have_attribute("aria-invalid", "true")
    # The form says exactly what the gateway says.
    answer = requests.post(
        f"{BASE}/api/v1/programs/validate_arguments/",
        json={"title": "console-form", "arguments": '{"n": "three"}'},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    ).json()
    expect(check.locator(".check-message")).to_have_text(answer["message"])
    assert answer["path"] == ["n"], answer
    arguments.fill('{"n": 3, "pause": 1.5}')
    expect(check).to_contain_text("match")
    expect(arguments).to_have_attribute("aria-invalid", "false")
    page.get_by_role("button", name="Run").click()

    # The job's page, followed live: RUNNING with log lines appearing, then SUCCEEDED.
    expect(page).to_have_url(re.compile(r"#/job/[0-9a-f-]{36}$"))
    mark_page(page)
    log = page.locator("#log")
    expect(log).to_contain_text("step 1 of 3")
    assert "SUCCEEDED" not in (status_badge(page).text_content() or ""), "the first line showed before the job ended"
    expect(status_badge(page)).to_have_text("RUNNING: EXECUTING_QPU")
    expect(status_badge(page)).to_have_text("SUCCEEDED")
    expect(log).to_contain_text("step 3 of 3")
    assert log.text_content().count("step 1 of 3") == 1
    timeline = page.locator("#events")
    expect(timeline).to_contain_text("→ SUCCEEDED")
    expect(timeline.locator("li").first).to_contain_text("QUEUED")
    expect(timeline.locator('li[data-type="SUB_STATUS_CHANGE"]')).to_contain_text("EXECUTING_QPU")
    # Where its time went: waited in the queue, then ran (it pauses 1.5 s between steps).
    expect(page.locator("#job-timing")).to_have_text(re.compile(r"^waited [0-9.]+ s, ran [0-9.]+ s$"))
    # The result, pretty-printed and downloadable.
    result = page.get_by_label("Result")
    expect(result).to_contain_text('"total": 6')
    assert "\n" in result.text_content()
    with page.expect_download() as download:
        page.get_by_role("button", name="Download result").click()
    saved = json.loads(open(download.value.path(), encoding="utf-8").read())
    assert saved["total"] == 6 and saved["greeting"] == "héllo ✓", saved
    # A finished job offers no Stop.
    expect(page.locator("#stop-button")).to_be_hidden()
    assert_not_reloaded(page)
    # Once the job has ended, the page goes quiet: no stream reopened, no poll.
    expect(page.locator("#log-state")).to_have_text("complete")
    settled = len(recorder.urls("/api/v1/"))
    page.wait_for_timeout(4000)
    assert recorder.urls("/api/v1/")[settled:] == [], "requests after the job ended"


def test_a_dropped_log_connection_resumes_without_repeating_lines(context, recorder, user, proxy):
    page = context.new_page()
    recorder.attach(page)
    base = f"http://127.0.0.1:{proxy.port}"
    sign_in(page, user.token, base=base)
    job_id = user.run(mode="ticks", n=20)
    page.goto(f"{base}/console/#/job/{job_id}")
    mark_page(page)
    log = page.locator("#log")
    expect(log).to_contain_text("tick 3")
    assert "tick 19" not in log.text_content()
    assert proxy.cut() > 0
    expect(status_badge(page)).to_have_text("SUCCEEDED")
    expect(page.locator("#log-state")).to_have_text("complete")
    text = log.text_content()
    for i in range(20):
        assert text.count(f"tick {i}\n") == 1, (i, text)
    streams = [urlparse(url) for url in recorder.urls("/logs/stream/")]
    assert len(streams) >= 2, "the log was reconnected"
    offsets = [int(parse_qs(url.query).get("offset", ["0"])[0]) for url in streams]
    assert offsets[0] == 0 and offsets[-1] > 0, offsets
    assert_not_reloaded(page)
    page.screenshot(path=str(OUT / "test_a_dropped_log_connection_resumes_without_repeating_lines.png"))
    from conftest import check_requests

    check_requests(recorder)


def test_stop_a_sleeping_job_shows_the_answer_and_then_stopped(page, user):
    sign_in(page, user.token)
    job_id = user.run(mode="sleep", n=1)
    user.wait(job_id, {"RUNNING"})
    open_job(page, job_id)
    expect(page.locator("#log")).to_contain_text("sleeping")
    page.get_by_role("link", name="Queue").click()
    expect(page.locator("#slots-used")).to_have_text(re.compile(r"^1 of \d+$"))
    expect(page.locator(f'tr[data-job="{job_id}"]')).to_contain_text("RUNNING")
    page.locator(f'tr[data-job="{job_id}"] a').click()
    # Stop asks first; "no" leaves the job running.
    page.get_by_role("button", name="Stop", exact=True).click()
    expect(page.locator("#stop-confirm")).to_be_visible()
    page.get_by_role("button", name="No, let it run").click()
    expect(page.locator("#stop-confirm")).to_be_hidden()
    expect(status_badge(page)).to_have_text("RUNNING")
    page.get_by_role("button", name="Stop", exact=True).click()
    page.get_by_role("button", name="Yes, stop the job").click()
    # While it stops, Stop is not offered again; the note shows the gateway's answer, then
    # follows the job to its end. The job reported no runtime jobs, so the answer's note that
    # no runtime service came to stop them with is left out (the API still sends it).
    expect(page.locator("#stop-button")).to_be_hidden()
    answer = page.locator("#stop-answer")
    gateway_said = f"Stop requested for job {job_id}; its status will show STOPPED once it has stopped."
    expect(status_badge(page)).to_have_text("STOPPED")
    expect(answer).to_have_text(f"{gateway_said} The job has stopped.")
    expect(page.locator("#stop-button")).to_be_hidden()
    expect(page.locator("#events")).to_contain_text("→ STOPPED")
    # A job's page that has ended says so, not "Live".
    expect(page.locator(".freshness")).to_have_attribute("data-state", "ended")
    expect(page.locator(".freshness")).to_contain_text("Ended · STOPPED")


def test_stop_a_job_that_reported_runtime_jobs_keeps_the_gateways_runtime_note(page, user):
    job_id = user.run(mode="sleep", n=1)
    user.wait(job_id, {"RUNNING"})
    user.post(f"jobs/{job_id}/runtime_jobs/", json={"runtime_job": "console-runtime-1"})
    sign_in(page, user.token)
    open_job(page, job_id)
    expect(status_badge(page)).to_have_text("RUNNING")
    page.get_by_role("button", name="Stop", exact=True).click()
    page.get_by_role("button", name="Yes, stop the job").click()
    expect(status_badge(page)).to_have_text("STOPPED")
    # Its runtime job could not be stopped without a runtime service: that is said, as sent.
    expect(page.locator("#stop-answer")).to_have_text(
        f"Stop requested for job {job_id}; its status will show STOPPED once it has stopped."
        " QiskitRuntimeService not found, cannot stop runtime jobs. The job has stopped."
    )


def test_live_line_moves_as_lines_arrive_and_says_when_the_job_ended(page, user, recorder):
    job_id = user.run(mode="ticks", n=16, pause=0.5)
    user.wait(job_id, {"RUNNING"})
    sign_in(page, user.token)
    open_job(page, job_id)
    line = page.locator(".freshness")
    expect(line).to_have_attribute("data-state", "live")
    expect(page.locator("#log")).to_contain_text("tick 1")
    first = line.locator("time").get_attribute("datetime")
    # Nothing is polled while the streams are open: the time moves because lines arrive.
    expect(page.locator("#log")).to_contain_text("tick 6")
    expect(line.locator("time")).not_to_have_attribute("datetime", first)
    assert line.text_content().startswith("Live · updated")
    expect(status_badge(page)).to_have_text("SUCCEEDED")
    expect(line).to_have_attribute("data-state", "ended")
    expect(line).to_contain_text("Ended · SUCCEEDED at")
    assert "Live" not in line.text_content()
    page.screenshot(path=str(OUT / "console-job-ended.png"))


def test_times_show_their_zone_and_the_iso_time_in_a_tooltip(browser, recorder, user):
    job_id = user.run(n=1, pause=0)
    user.wait(job_id)
    created = user.get(f"jobs/{job_id}/", with_result="false")["created"]
    context = browser.new_context(viewport={"width": 1180, "height": 820}, timezone_id="Asia/Kolkata", locale="en-US")
    try:
        page = context.new_page()
        recorder.attach(page)
        sign_in(page, user.token)
        cell = page.locator(f'tr[data-job="{job_id}"] td').nth(3).locator("time")
        expect(cell).to_have_text(re.compile(r"GMT\+5:30$"))
        iso = cell.get_attribute("title")
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", iso), iso
        assert iso[:19] == created[:19], (iso, created)
        open_job(page, job_id)
        expect(page.locator(".facts time").first).to_have_text(re.compile(r"GMT\+5:30$"))
        expect(page.locator(".freshness time")).to_have_text(re.compile(r"GMT\+5:30$"))
        page.screenshot(path=str(OUT / "test_times_show_their_zone.png"))
    finally:
        context.close()
    from conftest import check_requests

    check_requests(recorder)


def test_a_failing_job_shows_its_error_event(page, user):
    sign_in(page, user.token)
    job_id = user.run(mode="fail", n=1)
    open_job(page, job_id)
    expect(status_badge(page)).to_have_text("FAILED")
    error = page.locator('#events li[data-type="ERROR"]')
    expect(error).to_have_count(1)
    expect(error.locator(".error-code")).to_have_text("E42")
    expect(error.locator(".error-message")).to_have_text("ValueError: the widget broke")
    expect(error.locator(".error-exception")).to_have_text("WidgetError")
    expect(page.locator("#log")).to_contain_text("about to fail")


def test_files_upload_download_and_delete(page, user, tmp_path):
    sign_in(page, user.token)
    page.get_by_role("link", name="Files").click()
    page.get_by_label("Function").select_option(FUNCTION)
    page.get_by_role("button", name="Show").click()
    expect(page.get_by_text("No files yet.")).to_be_visible()
    data = tmp_path / "measurements.csv"
    data.write_text("shot,value\n1,0.5\n2,0.25\n", encoding="utf-8")
    page.get_by_label("File to upload").set_input_files(str(data))
    page.get_by_role("button", name="Upload", exact=True).click()
    row = page.locator('tr[data-file="measurements.csv"]')
    expect(row).to_be_visible()
    assert user.get("files/", function=FUNCTION)["results"] == ["measurements.csv"]
    with page.expect_download() as download:
        row.get_by_role("button", name="Download measurements.csv").click()
    assert download.value.suggested_filename == "measurements.csv"
    assert open(download.value.path(), encoding="utf-8").read() == data.read_text(encoding="utf-8")
    page.screenshot(path=str(OUT / "console-files.png"))
    row.get_by_role("button", name="Delete measurements.csv").click()
    row.get_by_role("button", name="Yes, delete measurements.csv").click()
    expect(page.locator("#file-answer")).to_have_text("Requested file was deleted.")
    expect(row).to_have_count(0)
    assert user.get("files/", function=FUNCTION)["results"] == []


def test_jobs_list_filters_pages_and_updates_statuses_live(page, user, recorder):
    quick = [user.run(n=1, pause=0) for _ in range(11)]
    for job_id in quick:
        user.wait(job_id)
    sign_in(page, user.token)
    mark_page(page)
    # Pages of ten, newest first, counted by the gateway.
    expect(page.locator(".pager .range")).to_have_text("1–10 of 11")
    expect(page.locator("table.jobs tbody tr")).to_have_count(10)
    expect(page.locator("table.jobs tbody tr").first).to_have_attribute("data-job", quick[-1])
    page.get_by_role("link", name="Next").click()
    expect(page.locator(".pager .range")).to_have_text("11–11 of 11")
    expect(page.locator("table.jobs tbody tr")).to_have_attribute("data-job", quick[0])
    # Pages are keyset pages: the route carries the gateway's cursor, never an offset, and every
    # list read asks by cursor (empty for the first page), so a deep page costs what the first does.
    assert "cursor=" in page.url and "offset=" not in page.url, page.url
    page.get_by_role("link", name="Previous").click()
    expect(page.locator(".pager .range")).to_have_text("1–10 of 11")
    expect(page.locator("table.jobs tbody tr").first).to_have_attribute("data-job", quick[-1])
    reads = recorder.urls("/api/v1/jobs/?")
    assert reads and all("cursor=" in url and "offset=" not in url for url in reads), reads
    page.get_by_role("link", name="Next").click()
    expect(page.locator(".pager .range")).to_have_text("11–11 of 11")
    # Filters: status, function, created after.
    page.get_by_label("Status").select_option("RUNNING")
    page.get_by_role("button", name="Apply").click()
    expect(page.get_by_text("No jobs match.")).to_be_visible()
    page.get_by_label("Status").select_option("SUCCEEDED")
    page.get_by_label("Function", exact=True).fill(FUNCTION)
    page.get_by_role("button", name="Apply").click()
    expect(page.locator(".pager .range")).to_have_text("1–10 of 11")
    page.get_by_label("Created after").fill("2999-01-01T00:00")
    page.get_by_role("button", name="Apply").click()
    expect(page.get_by_text("No jobs match.")).to_be_visible()
    assert "created_after=2999-01-01T" in page.url
    # A job started elsewhere appears and moves to SUCCEEDED without a reload.
    page.get_by_role("link", name="Clear").click()
    expect(page.locator(".pager .range")).to_have_text("1–10 of 11")
    job_id = user.run(n=5, pause=1.0)
    row = page.locator(f'tr[data-job="{job_id}"]')
    expect(row).to_be_visible()
    expect(row.locator(".badge")).to_have_text("RUNNING: EXECUTING_QPU")
    expect(row.locator(".badge")).to_have_text("SUCCEEDED")
    expect(page.locator(".pager .range")).to_have_text("1–10 of 12")
    expect(page.locator(".queue-line")).to_contain_text("0 of")
    assert_not_reloaded(page)
    # Polite: the page is re-read every few seconds, never in a loop.
    before = len(recorder.urls("/api/v1/jobs/?"))
    page.wait_for_timeout(6500)
    polled = len(recorder.urls("/api/v1/jobs/?")) - before
    assert 1 <= polled <= 3, f"{polled} list reads in 6.5 s"
    # A failing and a sleeping job take their places too (and make the README's picture), the
    # failed one with its reason under its status.
    failing = user.run(mode="divide", n=1)
    sleeping = user.run(mode="sleep", n=1)
    expect(page.locator(f'tr[data-job="{failing}"] .badge')).to_have_text("FAILED")
    expect(page.locator(f'tr[data-job="{failing}"] .row-reason')).to_have_text(
        "exit code 1: ZeroDivisionError: division by zero"
    )
    expect(page.locator(f'tr[data-job="{sleeping}"] .badge')).to_have_text("RUNNING")
    expect(page.locator(".queue-line")).to_contain_text("1 of")
    page.screenshot(path=str(OUT / "console-jobs.png"))
    user.post(f"jobs/{sleeping}/stop/", json={})
    expect(page.locator(f'tr[data-job="{sleeping}"] .badge')).to_have_text("STOPPED")


def test_provider_admin_sees_the_provider_log_and_provider_files(page, tmp_path):
    admin = Api(PROVIDER_ADMIN)
    admin.upload_function(title=f"{PROVIDER}/tool")
    job_id = admin.run(title="tool", provider=PROVIDER, n=1, pause=0)
    sign_in(page, PROVIDER_ADMIN)
    open_job(page, job_id)
    expect(status_badge(page)).to_have_text("SUCCEEDED")
    provider_log = page.locator("#provider-log")
    expect(provider_log).to_contain_text("provider side: job started in mode ok")
    expect(page.locator("#provider-log-state")).to_have_text("complete")
    page.screenshot(path=str(OUT / "console-provider-job.png"), full_page=True)
    # The provider's files of the function.
    page.goto(f"{BASE}/console/#/files?function=tool&provider={PROVIDER}&area=provider")
    expect(page.get_by_role("heading", name=f"Provider files of {PROVIDER}/tool")).to_be_visible()
    data = tmp_path / "calibration.json"
    data.write_text('{"qubits": 5}', encoding="utf-8")
    page.get_by_label("File to upload").set_input_files(str(data))
    page.get_by_role("button", name="Upload", exact=True).click()
    expect(page.locator('tr[data-file="calibration.json"]')).to_be_visible()
    assert "calibration.json" in admin.get("files/provider/", function="tool", provider=PROVIDER)["results"]
    # Someone else cannot see the provider's job at all.
    other = new_user("outsider")
    page.get_by_role("button", name="Sign out").click()
    sign_in(page, other)
    open_job(page, job_id)
    expect(page.get_by_role("alert")).to_have_text(f"Job [{job_id}] not found")


@pytest.mark.viewport(390, 844)
def test_phone_width_and_keyboard_only(page, user):
    job_id = user.run(n=1, pause=0)
    user.wait(job_id)
    page.goto(f"{BASE}/console/")
    # Keyboard only: the token field has focus, Enter signs in.
    expect(page.get_by_label("API token")).to_be_focused()
    page.keyboard.type(user.token)
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Jobs")).to_be_visible()
    # Tab reaches the first navigation link, and focus is visible.
    page.locator(".brand").focus()
    page.keyboard.press("Tab")
    focused = page.evaluate("document.activeElement.textContent.trim()")
    assert focused == "Jobs", focused
    outline = page.evaluate("getComputedStyle(document.activeElement).outlineStyle")
    assert outline not in ("", "none"), outline
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Functions")).to_be_visible()
    # Nothing wider than the phone.
    for view in ["#/jobs", f"#/job/{job_id}", "#/functions", f"#/function?title={FUNCTION}", "#/queue", "#/usage", f"#/files?function={FUNCTION}"]:
        page.goto(f"{BASE}/console/{view}")
        expect(page.locator("main h1")).to_be_visible()
        page.wait_for_load_state("networkidle")
        width = page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390, f"{view} is {width} px wide"
    page.goto(f"{BASE}/console/#/job/{job_id}")
    expect(status_badge(page)).to_have_text("SUCCEEDED")
    # Every form control has a label.
    for view in ["#/jobs", f"#/function?title={FUNCTION}", "#/upload", "#/usage", f"#/files?function={FUNCTION}"]:
        page.goto(f"{BASE}/console/{view}")
        page.wait_for_load_state("networkidle")
        unlabelled = page.evaluate(
            """[...document.querySelectorAll('main input, main select, main textarea')]
               .filter(c => !(c.labels && c.labels.length) && !c.getAttribute('aria-label'))
               .map(c => c.name)"""
        )
        assert unlabelled == [], (view, unlabelled)
