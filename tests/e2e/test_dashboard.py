"""The web dashboard end to end: Debian's Chromium (headless, Selenium) against a real
`sandcell serve` with gVisor sandboxes; jobs submitted with the CLI.

Screenshots of the main pages go to $SANDCELL_SCREENSHOT_DIR (tests/.artifacts/screenshots).
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import ADMIN_KEY, Server, run_job

pytestmark = pytest.mark.gvisor

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
    pytest.skip(
        "Debian's chromium and chromium-driver are not installed (scripts/install.sh adds them)",
        allow_module_level=True,
    )

from selenium import webdriver  # noqa: E402  (only once chromium is known to be there)
from selenium.common.exceptions import (  # noqa: E402
    StaleElementReferenceException,
    TimeoutException,
)
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.remote.webelement import WebElement  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

SCREENSHOTS = Path(
    os.environ.get("SANDCELL_SCREENSHOT_DIR")
    or Path(__file__).resolve().parents[1] / ".artifacts" / "screenshots"
)
CLI = [sys.executable, "-m", "sandcell.cli.main"]
RESULT = "total,42\n" + "".join(f"row-{i},{i * i}\n" for i in range(200))
COMPLETING = f"""
import time
print("starting the analysis")
time.sleep(2)
open("/output/result.csv", "w").write({RESULT!r})
print("wrote result.csv")
"""
HOSTILE = r"""
import sys
print("<script>document.title='pwned'; window.__pwned = 1;</script>")
print('<img src=x onerror="window.__pwned = 2; document.title = \'pwned\'">')
print("\x1b[31mRED ALERT\x1b[0m plain \x1b[1;32mbold green\x1b[0m")
print("\x1b]0;evil window title\x07after-osc \x1b[2J\x1b[Hcleared?")
sys.stderr.write("</pre><b>not bold</b>\n")
"""


@pytest.fixture(scope="module")
def downloads(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("downloads")


@pytest.fixture(scope="module")
def browser(downloads: Path) -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in a container: Chromium's own sandbox cannot start
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1440,1000",
        "--force-device-scale-factor=1",
    ):
        options.add_argument(arg)
    options.add_experimental_option(
        "prefs",
        {"download.default_directory": str(downloads), "download.prompt_for_download": False},
    )
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = webdriver.ChromeService(executable_path=CHROMEDRIVER)
    driver = webdriver.Chrome(options=options, service=service)
    driver.execute_cdp_cmd(
        "Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)}
    )
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def alice(server: Server) -> dict[str, str]:
    return _tenant(server, "dash-alice")


@pytest.fixture(scope="module")
def bob(server: Server) -> dict[str, str]:
    return _tenant(server, "dash-bob")


def _tenant(server: Server, name: str) -> dict[str, str]:
    headers = server.tenant(name)
    return headers | {"key": headers["Authorization"].removeprefix("Bearer ")}


def wait_for(driver: WebDriver, check: Callable[[WebDriver], Any], timeout: float = 30) -> Any:
    return WebDriverWait(driver, timeout, poll_frequency=0.2).until(check)


def css(driver: WebDriver, selector: str, timeout: float = 30) -> WebElement:
    found: WebElement = wait_for(
        driver, lambda d: next(iter(d.find_elements(By.CSS_SELECTOR, selector)), None), timeout
    )
    return found


def text_of(driver: WebDriver, selector: str, contains: str = "", timeout: float = 30) -> str:
    """The text of an element that the page may re-render meanwhile (read in one script)."""

    def ready(d: WebDriver) -> str | None:
        text = d.execute_script(
            "return document.querySelector(arguments[0])?.innerText ?? null", selector
        )
        return text if text is not None and contains in text else None

    try:
        found: str = wait_for(driver, ready, timeout)
    except TimeoutException:
        page = driver.execute_script("return document.getElementById('app').innerText")
        pytest.fail(f"no {selector!r} containing {contains!r} on the page:\n{page}")
    return found


def click(driver: WebDriver, selector: str, timeout: float = 30) -> None:
    """Click what `selector` names, again if a poll re-rendered it between finding and click."""

    def clicked(d: WebDriver) -> bool:
        try:
            css(d, selector, timeout).click()
        except StaleElementReferenceException:
            return False
        return True

    wait_for(driver, clicked, timeout)


def screenshot(driver: WebDriver, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    time.sleep(0.3)  # let the last poll's rows paint
    assert driver.save_screenshot(str(SCREENSHOTS / f"{name}.png"))


def sign_in(driver: WebDriver, server: Server, key: str) -> None:
    driver.get(f"{server.url}/ui/")
    driver.execute_script("sessionStorage.clear()")
    driver.get(f"{server.url}/ui/#/signin")
    css(driver, "#api-key").send_keys(key)
    click(driver, "#signin-submit")
    css(driver, "#who-name")


def sign_out(driver: WebDriver) -> None:
    click(driver, "#sign-out")
    css(driver, "#api-key")
    assert driver.execute_script("return Object.keys(sessionStorage)") == []


def cli_submit(server: Server, key: str, code: str, tmp_path: Path) -> dict[str, Any]:
    script = tmp_path / "job.py"
    script.write_text(code)
    done = subprocess.run(
        [*CLI, "run", str(script), "--no-wait", "--json"],
        env=server.env() | {"SANDCELL_API_KEY": key},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    job: dict[str, Any] = json.loads(done.stdout)
    return job


def job_row_state(driver: WebDriver, job_id: str) -> str | None:
    # Looked up and read in one script: the list re-renders its rows while jobs update, so
    # an element found first could be stale by the time it is read.
    state: str | None = driver.execute_script(
        "const row = document.querySelector(arguments[0]);"
        "return row ? row.getAttribute('data-state') : null;",
        f'tr.job-row[data-job-id="{job_id}"]',
    )
    return state


def log_text(driver: WebDriver, *contains: str, timeout: float = 60) -> str:
    """The job page's log once it shows every one of `contains` (stdout and stderr are
    streamed as they are stored: one may show a moment before the other)."""

    def ready(d: WebDriver) -> str | None:
        text = d.execute_script("return document.getElementById('job-log')?.textContent")
        return text if text and all(part in text for part in contains) else None

    found: str = wait_for(driver, ready, timeout)
    return found


def csp_violations(driver: WebDriver) -> list[str]:
    return [
        entry["message"]
        for entry in driver.get_log("browser")
        if "Content Security Policy" in entry["message"] or "Refused to" in entry["message"]
    ]


def test_the_ui_answers_with_a_strict_content_security_policy(server: Server) -> None:
    page = httpx.get(f"{server.url}/ui/")
    assert page.status_code == 200
    csp = dict(
        part.strip().split(" ", 1) for part in page.headers["content-security-policy"].split(";")
    )
    assert csp["script-src"] == "'self'" and csp["style-src"] == "'self'"
    assert csp["default-src"] == "'none'" and csp["object-src"] == "'none'"
    assert csp["frame-ancestors"] == "'none'" and csp["base-uri"] == "'none'"
    assert page.headers["x-frame-options"] == "DENY"
    assert "set-cookie" not in page.headers


def test_a_cli_job_appears_completes_and_its_artifact_downloads_intact(
    server: Server,
    browser: WebDriver,
    alice: dict[str, str],
    downloads: Path,
    tmp_path: Path,
) -> None:
    sign_in(browser, server, alice["key"])
    assert browser.execute_script("return location.href").endswith("#/jobs")
    assert alice["key"] not in browser.current_url
    assert browser.get_cookies() == []

    job = cli_submit(server, alice["key"], COMPLETING, tmp_path)
    assert wait_for(browser, lambda d: job_row_state(d, job["id"]), 15)
    assert wait_for(browser, lambda d: job_row_state(d, job["id"]) == "completed", 90)
    screenshot(browser, "jobs-list")

    click(browser, f'tr[data-job-id="{job["id"]}"] a.job-link')
    assert text_of(browser, "#job-id") == job["id"]
    logs = log_text(browser, "wrote result.csv")
    assert "starting the analysis" in logs
    text_of(browser, "#log-status", "ended: completed")  # the page's last reload
    record = httpx.get(f"{server.url}/v1/jobs/{job['id']}", headers=alice).json()
    [output] = record["outputs"]
    text_of(browser, 'tr[data-artifact="result.csv"]', output["sha256"])
    screenshot(browser, "job-completed")

    click(browser, 'tr[data-artifact="result.csv"] button.download')
    target = downloads / "result.csv"
    wait_for(browser, lambda d: target.exists() and target.stat().st_size == output["size"], 30)
    content = target.read_bytes()
    assert hashlib.sha256(content).hexdigest() == output["sha256"]
    assert content == RESULT.encode()
    assert csp_violations(browser) == []


def test_a_running_job_is_cancelled_after_confirmation(
    server: Server, browser: WebDriver, alice: dict[str, str], tmp_path: Path
) -> None:
    sign_in(browser, server, alice["key"])
    job = cli_submit(
        server,
        alice["key"],
        "import time\nprint('sleeping', flush=True)\ntime.sleep(300)",
        tmp_path,
    )
    browser.get(f"{server.url}/ui/#/jobs/{job['id']}")
    wait_for(browser, lambda d: css(d, ".page-head").get_attribute("data-state") == "running", 60)
    log_text(browser, "sleeping")
    screenshot(browser, "job-running")

    click(browser, "#cancel-job")
    click(browser, "#confirm-no")  # the first answer keeps it
    time.sleep(1)
    assert httpx.get(f"{server.url}/v1/jobs/{job['id']}", headers=alice).json()["state"] == (
        "running"
    )
    click(browser, "#cancel-job")
    click(browser, "#confirm-yes")
    wait_for(browser, lambda d: css(d, ".page-head").get_attribute("data-state") == "cancelled", 60)
    record = httpx.get(f"{server.url}/v1/jobs/{job['id']}", headers=alice).json()
    assert (record["state"], record["reason"]) == ("cancelled", "cancelled")
    screenshot(browser, "job-cancelled")


def test_a_hostile_log_is_shown_as_text_and_nothing_in_it_runs(
    server: Server, browser: WebDriver, alice: dict[str, str], tmp_path: Path
) -> None:
    sign_in(browser, server, alice["key"])
    job = cli_submit(server, alice["key"], HOSTILE, tmp_path)
    browser.get(f"{server.url}/ui/#/jobs/{job['id']}")
    text = log_text(browser, "not bold", "window.__pwned = 1;", "after-osc", timeout=90)
    time.sleep(1)  # give anything that could run the chance to
    assert browser.title == "sandcell"
    assert browser.execute_script("return window.__pwned") is None
    assert "<script>document.title='pwned'; window.__pwned = 1;</script>" in text
    assert '<img src=x onerror="window.__pwned = 2;' in text
    assert "</pre><b>not bold</b>" in text
    log = css(browser, "#job-log")
    assert log.find_elements(By.CSS_SELECTOR, "script, img, b") == []
    assert "\x1b" not in text and "evil window title" not in text
    red = log.find_elements(By.CSS_SELECTOR, "span.ansi-fg-1")
    assert [span.text for span in red] == ["RED ALERT"]
    bold = log.find_element(By.CSS_SELECTOR, "span.ansi-bold.ansi-fg-2")
    assert bold.text == "bold green"
    screenshot(browser, "job-hostile-log")
    assert csp_violations(browser) == []


def test_a_second_tenant_sees_none_of_it(
    server: Server, browser: WebDriver, alice: dict[str, str], bob: dict[str, str], tmp_path: Path
) -> None:
    job = cli_submit(server, alice["key"], "print('alice only')", tmp_path)
    sign_in(browser, server, alice["key"])
    wait_for(browser, lambda d: job_row_state(d, job["id"]))
    sign_out(browser)

    sign_in(browser, server, bob["key"])
    css(browser, "#jobs-table tr.empty")
    time.sleep(2.5)  # one more poll: still nothing
    assert browser.find_elements(By.CSS_SELECTOR, "tr.job-row") == []
    assert "alice" not in text_of(browser, "#app")
    screenshot(browser, "jobs-other-tenant-empty")

    browser.get(f"{server.url}/ui/#/jobs/{job['id']}")
    text_of(browser, "#not-found", "no job with this id")
    assert browser.find_elements(By.CSS_SELECTOR, "#job-log") == []
    screenshot(browser, "job-other-tenant-not-found")
    answer = httpx.get(f"{server.url}/v1/jobs/{job['id']}", headers=bob)
    assert answer.status_code == 404


def test_a_session_runs_cells_with_text_and_a_chart_and_stops(
    server: Server, browser: WebDriver, alice: dict[str, str]
) -> None:
    sign_in(browser, server, alice["key"])
    browser.get(f"{server.url}/ui/#/sessions")
    click(browser, "#new-session")
    wait_for(browser, lambda d: "#/sessions/" in d.current_url, 90)
    session_id = browser.current_url.rsplit("/", 1)[-1]
    wait_for(browser, lambda d: css(d, "#run-cell").is_enabled(), 90)
    css(browser, "#cell-code").send_keys("print('hello from the kernel')\n6 * 7")
    click(browser, "#run-cell")
    text_of(browser, "#cells .cell-out", "hello from the kernel", 120)
    assert text_of(browser, ".cell-result") == "42"
    chart = (
        "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2, 5]); plt.title('sales'); plt.show()"
    )
    css(browser, "#cell-code").send_keys(chart)
    click(browser, "#run-cell")
    # Looked up in the same script that reads it: the page re-renders the cells as they update.
    width = wait_for(
        browser,
        lambda d: d.execute_script(
            "return document.querySelector('img.cell-img')?.naturalWidth || null"
        ),
        120,
    )
    assert width > 100
    screenshot(browser, "session")

    click(browser, "#stop")
    click(browser, "#confirm-yes")
    answer = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        answer = httpx.get(f"{server.url}/v1/sessions/{session_id}", headers=alice).json()
        if answer["state"] == "stopped":
            break
        time.sleep(0.5)
    assert answer["state"] == "stopped"
    browser.get(f"{server.url}/ui/#/sessions")
    css(browser, f'tr[data-session-id="{session_id}"]')
    screenshot(browser, "sessions-list")


def session_state(driver: WebDriver) -> str | None:
    state: str | None = driver.execute_script(
        "return document.getElementById('session-head')?.dataset.state ?? null"
    )
    return state


def run_cell(driver: WebDriver, code: str) -> None:
    wait_for(driver, lambda d: css(d, "#run-cell").is_enabled(), 120)
    box = css(driver, "#cell-code")
    box.clear()
    box.send_keys(code)
    click(driver, "#run-cell")


def test_a_session_page_shows_the_servers_history_and_pauses_keeping_memory(
    server: Server, browser: WebDriver, alice: dict[str, str]
) -> None:
    auth = {"Authorization": alice["Authorization"]}
    with httpx.Client(base_url=server.url, headers=auth, timeout=180) as http:
        sid = (
            http.post("/v1/sessions", json={"image": "python-data"}).raise_for_status().json()["id"]
        )
        for code in ("kept = 41", "print('from the api', kept)"):
            http.post(f"/v1/sessions/{sid}/execute", json={"code": code}).raise_for_status()
    sign_in(browser, server, alice["key"])
    browser.get(f"{server.url}/ui/#/sessions/{sid}")
    # Cells this browser never ran: the page reads them from the server.
    text_of(browser, '#cells article.cell[data-seq="2"]', "from the api 41", 60)
    text_of(browser, '#cells article.cell[data-seq="1"]', "kept = 41")
    run_cell(browser, "kept += 1\nprint('<i>from the page</i>', kept)")
    text_of(browser, '#cells article.cell[data-seq="3"]', "<i>from the page</i> 42", 120)
    assert browser.find_elements(By.CSS_SELECTOR, "#cells i") == []

    sign_in(browser, server, alice["key"])  # a fresh browser session: nothing kept locally
    assert browser.execute_script("return Object.keys(sessionStorage)") == ["sandcell.key"]
    browser.get(f"{server.url}/ui/#/sessions/{sid}")
    text_of(browser, '#cells article.cell[data-seq="3"]', "from the page", 60)
    seqs = [
        a.get_attribute("data-seq")
        for a in css(browser, "#cells").find_elements(By.CSS_SELECTOR, "article.cell")
    ]
    assert seqs == ["3", "2", "1"]  # newest first
    screenshot(browser, "session-history")

    wait_for(browser, lambda d: session_state(d) == "running", 60)
    click(browser, "#pause")
    wait_for(browser, lambda d: session_state(d) == "paused", 180)
    assert text_of(browser, "#pause-mode", "memory").startswith("memory")
    record = httpx.get(f"{server.url}/v1/sessions/{sid}", headers=auth).json()
    assert (record["state"], record["memory_kept"]) == ("paused", True)
    assert not css(browser, "#run-cell").is_enabled()
    text_of(browser, '#cells article.cell[data-seq="3"]', "from the page")  # still shown
    screenshot(browser, "session-paused")

    click(browser, "#resume")
    wait_for(browser, lambda d: session_state(d) == "running", 180)
    run_cell(browser, "print('after resume', kept)")
    text_of(browser, '#cells article.cell[data-seq="4"]', "after resume 42", 120)
    screenshot(browser, "session-resumed")

    click(browser, "#stop")
    click(browser, "#confirm-yes")
    wait_for(browser, lambda d: session_state(d) == "stopped", 120)
    browser.refresh()
    text_of(browser, '#cells article.cell[data-seq="4"]', "after resume 42", 60)
    assert browser.find_elements(By.CSS_SELECTOR, "#pause, #resume, #stop") == []
    screenshot(browser, "session-stopped-history")
    assert csp_violations(browser) == []


def test_the_admin_edits_a_tenants_quotas_and_they_hold(server: Server, browser: WebDriver) -> None:
    tenant = _tenant(server, "dash-quota")
    auth = {"Authorization": tenant["Authorization"]}
    tenant_id = httpx.get(f"{server.url}/v1/ui/whoami", headers=auth).json()["tenant_id"]
    row = f'tr[data-tenant-id="{tenant_id}"]'
    sign_in(browser, server, ADMIN_KEY)
    browser.get(f"{server.url}/ui/#/admin/tenants")
    text_of(browser, row, "storage_mb=10240")
    click(browser, f"{row} button.edit-quotas")
    css(browser, "#quota-storage_mb").send_keys("0")
    css(browser, "#quota-sessions").send_keys("1")
    screenshot(browser, "admin-quotas-edit")
    click(browser, "#quota-save")
    text_of(browser, row, "storage_mb=0")
    assert "sessions=1" in text_of(browser, row)
    assert browser.find_elements(By.CSS_SELECTOR, "#quota-form") == []
    screenshot(browser, "admin-quotas-saved")
    refused = httpx.post(f"{server.url}/v1/files", files={"file": ("a", b"x")}, headers=auth)
    assert refused.status_code == 429, refused.text

    click(browser, f"{row} button.edit-quotas")
    assert css(browser, "#quota-storage_mb").get_attribute("value") == "0"
    click(browser, '#quota-form label[for="quota-storage_mb"] button')  # back to the default
    click(browser, "#quota-save")
    text_of(browser, row, "storage_mb=10240")
    accepted = httpx.post(f"{server.url}/v1/files", files={"file": ("a", b"x")}, headers=auth)
    assert accepted.status_code == 201, accepted.text
    tenants = httpx.get(f"{server.url}/v1/admin/overview/tenants", headers=server.admin).json()
    mine = next(t for t in tenants["items"] if t["id"] == tenant_id)
    assert mine["quota_overrides"] == {"sessions": 1}
    audit = httpx.get(
        f"{server.url}/v1/admin/audit", params={"action": "tenant.quotas"}, headers=server.admin
    ).json()["items"]
    assert [e["detail"]["changes"] for e in audit if e["target"] == tenant_id] == [
        {"storage_mb": None},
        {"sessions": 1, "storage_mb": 0},
    ]
    assert csp_violations(browser) == []
    sign_out(browser)


def test_the_admin_sees_health_tenants_keys_and_the_audit_log(
    server: Server, browser: WebDriver, alice: dict[str, str]
) -> None:
    job = run_job(server, alice, {"code": "print('for the admin')"})
    sign_in(browser, server, ADMIN_KEY)
    assert text_of(browser, "#who-name") == "admin"
    tenant_id = text_of(browser, f'tr[data-job-id="{job["id"]}"]', "completed").split()[1]
    assert tenant_id.startswith("ten_")  # every tenant's jobs, each naming its tenant
    screenshot(browser, "admin-jobs")

    browser.get(f"{server.url}/ui/#/admin/health")
    text_of(browser, "#stat-runtime", "gvisor")
    assert "python-data" in text_of(browser, "#health", "sha256:")
    assert browser.find_elements(By.CSS_SELECTOR, "#health svg.chart rect.chart-bar")
    screenshot(browser, "admin-health")

    browser.get(f"{server.url}/ui/#/admin/tenants")
    text_of(browser, "#tenants", "dash-alice")
    screenshot(browser, "admin-tenants")

    browser.get(f"{server.url}/ui/#/admin/keys")
    text_of(browser, "#key-tenant", "dash-alice")
    css(browser, "#key-tenant").send_keys("dash-alice")
    click(browser, "#key-tenant ~ button")
    key = text_of(browser, "#new-key-value", "sc_")
    assert key.startswith("sc_")
    key_id = key.split("_")[1]
    bearer = {"Authorization": f"Bearer {key}"}
    assert httpx.get(f"{server.url}/v1/jobs", headers=bearer).status_code == 200
    screenshot(browser, "admin-keys")
    row = css(browser, f'tr[data-key-id="{key_id}"]')
    row.find_element(By.CSS_SELECTOR, "button").click()
    click(browser, "#confirm-yes")
    text_of(browser, f'tr[data-key-id="{key_id}"]', "revoked")
    assert httpx.get(f"{server.url}/v1/jobs", headers=bearer).status_code == 401

    browser.get(f"{server.url}/ui/#/admin/audit")
    text_of(browser, "#audit", "key.revoke")
    screenshot(browser, "admin-audit")
    assert csp_violations(browser) == []
    sign_out(browser)


def test_a_wrong_key_is_refused_at_sign_in(server: Server, browser: WebDriver) -> None:
    driver = browser
    driver.get(f"{server.url}/ui/")
    driver.execute_script("sessionStorage.clear()")
    driver.get(f"{server.url}/ui/#/signin")
    css(driver, "#api-key").send_keys("sc_nope_nope")
    click(driver, "#signin-submit")
    text_of(driver, "#signin-error", "not accepted", 10)
    assert driver.execute_script("return Object.keys(sessionStorage)") == []
    screenshot(driver, "sign-in")
