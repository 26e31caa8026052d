"""Fair shares between tenants in the console (issue 48), each on a gateway of the test's own with
one CPU slot: a tenant declared for a provider with `gantry admin set-quota`, its guarantee held
by its own backfill job, and a job of it held for its guarantee (`tenant_quota`), then, with its
quotas changed live, for its borrowing cap (`borrowing_cap`): the queue page's Tenants section
with the tenant's figures and each job's tenant, backfill mark and reason in words, at a normal
width and at 400 px. On a gateway that reclaims at once: a backfill job's page says it runs as
backfill, then shows the preemption's reason naming the tenant, and the tenant's job its
admission within the guarantee."""

import pytest
from conftest import FUNCTION, OUT, Api, OwnGateway, new_user, sign_in
from playwright.sync_api import expect

TENANT_PROVIDER = "acme"
TENANT = f"provider:{TENANT_PROVIDER}"


@pytest.fixture
def gateways():
    """Starts gateways of the test's own with the flags given; closes them after the test."""
    started = []

    def start(*flags: str) -> OwnGateway:
        gateway = OwnGateway(*flags)
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        gateway.close()


def provider_admin(gateway: OwnGateway) -> Api:
    """The provider `acme` on `gateway`, with the test function; its admin's API (who runs it)."""
    token = new_user("acme-admin")
    gateway.admin("create-provider", TENANT_PROVIDER)
    gateway.admin("add-admin", "--provider", TENANT_PROVIDER, "--user", token)
    api = Api(token, base=gateway.base)
    api.upload_function(title=f"{TENANT_PROVIDER}/{FUNCTION}")
    return api


def run(api: Api, backfill: bool = False, **arguments) -> str:
    config = {"backfill": True} if backfill else None
    return api.run(title=FUNCTION, provider=TENANT_PROVIDER, config=config, **arguments)


def figure(page, key: str, kind: str):
    return page.locator(f'#queue-tenants [data-tenant="{TENANT}"] tr[data-figure="{key}"] td[data-kind="{kind}"]')


def test_the_queue_shows_the_tenant_its_figures_and_why_its_job_waits(gateways, page):
    gateway = gateways("--max-cpu-jobs", "1", "--backfill-grace", "1h")
    api = provider_admin(gateway)
    said = gateway.admin("set-quota", "--provider", TENANT_PROVIDER, "--cpu", "1", "--cpu-borrow-cap", "2", "--weight", "3")
    assert TENANT in said, said
    # Its own backfill job takes the one slot, lent from its guarantee; its next job waits for
    # the guarantee (backfill is stopped for it only after the grace, an hour here).
    filler = run(api, backfill=True, mode="sleep", n=1)
    api.wait(filler, {"RUNNING"})
    held = run(api, n=1, pause=0)

    sign_in(page, api.token, base=gateway.base)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Queue").click()
    tenants = page.locator("#queue-tenants")
    expect(tenants.get_by_role("heading", name="Tenants")).to_be_visible()
    card = tenants.locator(f'[data-tenant="{TENANT}"]')
    expect(card.locator("h3")).to_have_text(f"{TENANT} weight 3")
    # The figures, as the last admission pass saw them (the page reads them every 3 s).
    expected = {
        ("guaranteed", "cpu"): "1",
        ("guaranteed", "gpu"): "0",
        ("used", "cpu"): "1, of which 1 backfill",
        ("used", "gpu"): "0",
        ("borrowed", "cpu"): "0",
        ("lent", "cpu"): "1",
        ("waiting", "cpu"): "1",
        ("borrow-cap", "cpu"): "2",
        ("borrow-cap", "gpu"): "no cap",
    }
    for (key, kind), text in expected.items():
        expect(figure(page, key, kind)).to_have_text(text)
    expect(card.locator(".seen time")).to_be_visible()
    # Each job names its tenant; the backfill one is marked; the held one says why in words.
    held_row = page.locator(f'tr[data-job="{held}"]')
    filler_row = page.locator(f'tr[data-job="{filler}"]')
    expect(held_row.locator("td.tenant")).to_have_text(TENANT)
    expect(filler_row.locator("td.tenant")).to_have_text(TENANT)
    expect(filler_row.locator(".badge.backfill")).to_have_text("backfill")
    expect(held_row.locator(".badge.backfill")).to_have_count(0)
    expect(filler_row.locator(".waiting-for")).to_have_text("Started")
    waiting = held_row.locator(".waiting-for")
    expect(waiting).to_have_attribute("data-waiting-for", "tenant_quota")
    guarantee_words = (
        f"Its tenant's guarantee, lent out for now: {TENANT} runs 0 of its 1 guaranteed CPU slot (backfill not counted); "
        "the slots come back as jobs end, or when backfill jobs on them are stopped after a grace period"
    )
    expect(waiting).to_have_text(guarantee_words)
    expect(page.locator("#queue-limits")).to_contain_text("CPU slots: 1 of 1 in use")
    page.screenshot(path=str(OUT / "console-queue-tenants.png"), full_page=True)

    # At 400 px: the same figures, nothing wider than the screen, the tenant's table whole.
    page.set_viewport_size({"width": 400, "height": 860})
    card.scroll_into_view_if_needed()
    expect(figure(page, "borrow-cap", "gpu")).to_be_visible()
    expect(figure(page, "used", "cpu")).to_have_text("1, of which 1 backfill")
    page.wait_for_load_state("networkidle")
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 400, f"the Queue page is {width} px wide"
    table = card.locator("table.tenant-slots")
    box = table.bounding_box()
    assert box and box["x"] >= 0 and box["x"] + box["width"] <= 400, box
    # Each job a block of labelled lines: the reason reads without scrolling sideways.
    expect(waiting).to_have_text(guarantee_words)
    box = waiting.bounding_box()
    assert box and box["x"] >= 0 and box["x"] + box["width"] <= 400, box
    waiting.scroll_into_view_if_needed()
    expect(waiting).to_be_in_viewport(ratio=1)
    page.screenshot(path=str(OUT / "console-queue-tenants-400px.png"), full_page=True)
    page.set_viewport_size({"width": 1180, "height": 820})

    # The held job's page: its tenant and what holds it, in the same words.
    held_row.locator("a").first.click()
    expect(page.locator("#job-tenant")).to_have_text(TENANT)
    expect(page.locator("#job-queue .waiting-for")).to_have_text(f"Held back by: {guarantee_words}.")
    expect(page.locator("#job-backfill")).to_be_hidden()
    # The backfill job's page says it runs as backfill.
    page.goto(f"{gateway.base}/console/#/job/{filler}")
    expect(page.locator("#job-backfill")).to_contain_text("It runs as backfill")
    expect(page.locator("#job-tenant")).to_have_text(TENANT)
    expect(page.locator("#events")).to_contain_text(f"admitted on capacity lent to tenant {TENANT}")

    # No guarantee and nothing to borrow, live: the held job now waits for its borrowing cap.
    gateway.admin("set-quota", "--provider", TENANT_PROVIDER, "--cpu", "0", "--cpu-borrow-cap", "0")
    page.goto(f"{gateway.base}/console/#/queue")
    expect(waiting).to_have_attribute("data-waiting-for", "borrowing_cap")
    expect(waiting).to_have_text(
        f"Its tenant's borrowing cap: {TENANT} uses 1 CPU slot and may use at most 0 (0 guaranteed + a borrowing cap of 0); "
        "it waits until its jobs use fewer"
    )
    expect(figure(page, "guaranteed", "cpu")).to_have_text("0")
    expect(figure(page, "borrowed", "cpu")).to_have_text("1")
    expect(figure(page, "borrow-cap", "cpu")).to_have_text("0")
    assert api.get(f"jobs/{held}/", with_result="false")["status"] == "QUEUED"


def test_a_backfill_jobs_page_says_so_then_why_a_tenant_stopped_it(gateways, page):
    gateway = gateways("--max-cpu-jobs", "1", "--backfill-grace", "0")
    api = provider_admin(gateway)
    gateway.admin("set-quota", "--provider", TENANT_PROVIDER, "--cpu", "1")
    filler = run(api, backfill=True, mode="sleep", n=1)
    api.wait(filler, {"RUNNING"})
    sign_in(page, api.token, base=gateway.base)
    page.goto(f"{gateway.base}/console/#/job/{filler}")
    expect(page.locator("#job-status .badge")).to_have_text("RUNNING")
    expect(page.locator("#job-backfill")).to_contain_text("It runs as backfill")
    expect(page.locator("#job-backfill .badge.backfill")).to_have_text("backfill")

    # A job of the tenant within its guarantee: with no grace, the backfill job is stopped for it.
    work = run(api, n=1, pause=0)
    preempted = f"Preempted: tenant {TENANT} reclaimed its guaranteed capacity (this job ran as backfill)."
    expect(page.locator("#job-status .badge")).to_have_text("STOPPED")
    # Its reason at the top, as any reason is, and in the timeline with the move.
    expect(page.locator("#job-reason")).to_have_text(f"STOPPED: {preempted}")
    expect(page.locator('#events li[data-type="STATUS_CHANGE"]').last.locator(".event-reason")).to_have_text(preempted)
    page.screenshot(path=str(OUT / "console-job-preempted.png"), full_page=True)

    # The tenant's job ran within its guarantee, and its admission says so.
    assert api.wait(work) == "SUCCEEDED"
    page.goto(f"{gateway.base}/console/#/job/{work}")
    expect(page.locator("#job-status .badge")).to_have_text("SUCCEEDED")
    expect(page.locator("#events .event-reason").first).to_have_text(f"admitted within the guarantee of tenant {TENANT}")
    # A success shows no reason at the top, though its moves carried some.
    expect(page.locator("#job-reason")).to_be_empty()
