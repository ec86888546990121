"""The dashboard in a real browser: headless Chromium (Debian's ``chromium``) driven by Playwright.

Each page is loaded against the live gateway of ``conftest.live`` (tiny model, real traffic, a
training step), its content that matters is checked, and a screenshot is saved under the test's
tmp dir (and under ``$CLAWRL_SCREENSHOTS`` when set: README's pictures come from there).

``make test`` installs Chromium and Playwright. Without them this module fails, unless
``CLAWRL_ALLOW_NO_BROWSER=1`` skips it explicitly.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from .conftest import HINT, TRICKY, wait_for

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")


def _chromium() -> str | None:
    given = os.environ.get("CLAWRL_CHROMIUM")
    if given:
        return given
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


def _missing(why: str) -> None:
    if os.environ.get("CLAWRL_ALLOW_NO_BROWSER") == "1":
        pytest.skip(f"{why} (CLAWRL_ALLOW_NO_BROWSER=1)")
    pytest.fail(f"{why}: run `make test` (installs Debian's chromium and playwright), or set "
                "CLAWRL_ALLOW_NO_BROWSER=1 to skip the browser tests", pytrace=False)  # fmt: skip


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed")
    exe = _chromium()
    if exe is None:
        _missing("no Chromium executable (looked for chromium, chromium-browser, google-chrome)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


@pytest.fixture
def page(browser, tmp_path):
    ctx = browser.new_context(viewport={"width": 1366, "height": 860})
    pg = ctx.new_page()
    problems: list[str] = []
    pg.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    pg.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    pg.problems = problems  # type: ignore[attr-defined]
    yield pg
    ctx.close()
    assert problems == []


def shoot(pg, tmp_path: Path, name: str) -> None:
    pg.screenshot(path=str(tmp_path / f"{name}.png"), full_page=False)
    out = os.environ.get("CLAWRL_SCREENSHOTS")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        pg.screenshot(path=str(Path(out) / f"dashboard-{name}.png"), full_page=False)
    assert (tmp_path / f"{name}.png").stat().st_size > 10_000


def load(pg, url: str) -> None:
    pg.goto(url)
    pg.wait_for_function("Number(document.body.dataset.loaded || 0) >= 1", timeout=20_000)


def test_overview(live, page, tmp_path):
    load(page, live.url)
    step = page.locator('[data-card="training step"] .card-value').inner_text()
    assert int(step) >= 1
    assert page.locator('[data-card="policy version"] .card-value').inner_text().startswith("v")
    assert "live" in page.locator("#live").inner_text()
    shoot(page, tmp_path, "overview")


def test_sessions_search(live, page, tmp_path):
    live.runtime.dashboard._cache.clear()  # views are reused for a second
    load(page, f"{live.url}/sessions")
    total = live.runtime.store.count_sessions()
    assert page.locator("tr[data-session]").count() == total >= 2
    assert f"of {total} session(s)" in page.locator("#session-count").inner_text()
    page.fill("#search", "two")
    page.wait_for_function("document.querySelectorAll('tr[data-session]').length === 1")
    assert page.locator("tr[data-session]").first.get_attribute("data-session") == "dash-two"
    assert "q=two" in page.url
    page.fill("#search", "")
    page.wait_for_function(f"document.querySelectorAll('tr[data-session]').length === {total}")
    shoot(page, tmp_path, "sessions")
    page.click("a:text('dash-one')")
    page.wait_for_url("**/session?id=dash-one")


def test_sessions_filter_by_user(live, page):
    """The user column links to that user's sessions; 'all users' lists everyone's again."""
    live.runtime.dashboard._cache.clear()
    load(page, f"{live.url}/sessions")
    total = live.runtime.store.count_sessions()
    assert page.locator('tr[data-session="dash-one"] a.user').inner_text() == "alice"
    assert page.locator('tr[data-session="dash-two"] a.user').count() == 0
    page.click('tr[data-session="dash-one"] a.user')
    page.wait_for_function("document.querySelectorAll('tr[data-session]').length === 1")
    assert "user=alice" in page.url
    assert "of user “alice”" in page.locator("#session-count").inner_text()
    page.click("button:text('all users')")
    page.wait_for_function(f"document.querySelectorAll('tr[data-session]').length === {total}")
    assert "user=" not in page.url


def test_a_session_follows_a_turn_from_request_to_training(live, page, tmp_path):
    load(page, f"{live.url}/session?id=dash-one")
    first = page.locator("article.turn").first
    assert "what is 2 + 2?" in first.locator(".messages").inner_text()
    assert "no, that is wrong, redo it" in first.locator(".next-state").inner_text()
    assert "−1" in first.locator(".judgment").inner_text()
    assert HINT in first.locator(".hint").inner_text()
    assert page.locator("article.turn").count() == 3
    assert page.locator(".training.tr-trained").count() >= 1
    assert "trained at step" in page.locator(".training.tr-trained").first.inner_text()
    shoot(page, tmp_path, "session")


def test_store_text_is_shown_as_text_never_run(live, page):
    """Messages, next states, hints and the client name (the User-Agent) are hostile HTML."""
    for path in ("/session?id=dash-two", "/sessions", "/judge"):
        load(page, f"{live.url}{path}")
        page.wait_for_timeout(300)  # an injected onerror handler would have run by now
        assert page.evaluate("window.__pwned") is None, path
        assert page.locator("main img, main script").count() == 0, path
    load(page, f"{live.url}/session?id=dash-two")
    assert TRICKY in page.locator(".next-state pre").first.inner_text()
    assert TRICKY in page.locator(".hint").first.inner_text()
    assert TRICKY in page.locator("main > #content > p.muted").first.inner_text()


def test_a_curve_gains_a_point_after_a_step(live, page, tmp_path):
    load(page, f"{live.url}/training")
    loss = page.locator('[data-chart="loss"]')
    before = int(loss.get_attribute("data-points") or 0)
    assert before >= 1
    target = live.steps() + 1
    for i in range(4):
        if live.steps() >= target:
            break
        live.converse(f"dash-more-{target}-{i}", ["thanks!", "no, wrong again"])
    assert wait_for(lambda: live.steps() >= target), live.runtime.service.status()
    page.wait_for_function(
        f"Number(document.querySelector('[data-chart=\"loss\"]').dataset.points) >= {before + 1}",
        timeout=20_000,
    )
    assert page.locator("figure.chart").count() >= 6
    shoot(page, tmp_path, "training")


def test_judge_page(live, page, tmp_path):
    load(page, f"{live.url}/judge")
    assert page.locator('[data-bars="Scores"] .bar-row').count() >= 2
    assert int(page.locator('[data-card="judged"] .card-value').inner_text()) >= 2
    assert page.locator("table tbody tr").count() >= 2
    shoot(page, tmp_path, "judge")


def test_memory_page(live, page, tmp_path):
    """The Memory page lists active and ended entries; their text is shown as text."""
    import httpx

    base = f"{live.server.url}/v1/memory"
    for text in (f"Lead with the number. {TRICKY}", "Keep it short.", "Longer answers please."):
        assert httpx.post(base, json={"text": text}).status_code == 201
    from clawrl.memory import MemoryKeeper

    first = httpx.get(base).json()["data"][0]
    assert first["text"].startswith("Lead with")
    keeper = MemoryKeeper(live.runtime.store, retire_turns=2, retire_gap=0.05)
    keeper.record_distillation([("t1", [first["id"]], 0.25)], step=3)  # the gap, not retired
    load(page, f"{live.url}/memory")
    assert page.locator('[data-card="active entries"] .card-value').inner_text() == "2"
    assert page.locator('[data-card="replaced"] .card-value').inner_text() == "1"
    assert page.locator('[data-card="retired"] .card-value').inner_text() == "0"
    active = page.locator("main table").first.inner_text()
    assert TRICKY in active and "0.250 (1)" in active
    assert "Keep it short." in page.locator("main table").nth(1).inner_text()
    keeper.record_distillation([("t2", [first["id"]], 0.01), ("t3", [first["id"]], 0.0)], step=4)
    page.wait_for_timeout(1100)  # the dashboard's cache (CACHE_S)
    load(page, f"{live.url}/memory")
    assert page.locator('[data-card="retired"] .card-value').inner_text() == "1"
    ended = page.locator("main table").nth(1).inner_text()
    assert "retired (the weights alone follow it" in ended and "0.005 (2)" in ended
    page.wait_for_timeout(300)
    assert page.evaluate("window.__pwned") is None
    assert page.locator("main img, main script").count() == 0
    shoot(page, tmp_path, "memory")
