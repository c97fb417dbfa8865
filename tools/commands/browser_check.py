"""``browser-check``: the dashboard in headless Chromium, offline, checked for what a person would see.

A temporary clone whose main~1 carries the tag XSS_TAG, results of a quick asv run of main and main~1, published as
the main job does; served on 127.0.0.1 and opened in chromium through Playwright, every other request aborted.
Exit 0 on success, 1 on a failed check, 0 with a line starting "SKIPPED" without Chromium, Playwright or npm.
"""

import functools
import http.server
import json
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from .. import common, publish

LOCKS_WORKSPACE = True
GRAPHED = "bench_cache.CacheStrategy.time_decode"
XSS_TAG = '<img/src="x"/onerror="alert(document.domain)">'  # asv 0.6.6 pastes tag names as HTML


class CheckFailed(Exception):
    """What the browser showed is not what the dashboard must show."""


def workspace(work):
    """The clone (main~1 tagged with XSS_TAG) and an asv config whose results and html are in ``work``."""
    repo = work / "repo"
    subprocess.run(["git", "clone", "-q", "--shared", "--branch", common.BRANCH, str(common.ROOT), str(repo)],
                   check=True)
    subprocess.run(["git", "-C", str(repo), "tag", XSS_TAG, f"{common.BRANCH}~1"], check=True)
    conf = json.loads((common.ROOT / "asv.conf.json").read_text())
    conf.update(repo=str(repo), env_dir=str(common.ROOT / ".asv" / "env"), results_dir=str(work / "results"),
                benchmark_dir=str(common.ROOT / "benchmarks"), html_dir=str(work / "html"))
    (work / "asv.conf.json").write_text(json.dumps(conf))
    return work / "asv.conf.json"


def make_results(config, work):
    commits = common.git("rev-list", "--first-parent", "--max-count=2", common.BRANCH).split()
    (work / "commits.txt").write_text("\n".join(commits) + "\n")
    asv = (*common.ASV, "--config", config)
    common.run(*asv, "machine", "--yes", capture=True)
    if common.run(*asv, "run", "--quick", "--bench", "bench_cache", f"HASHFILE:{work / 'commits.txt'}",
                  check=False) not in (0, 2):
        raise CheckFailed("asv run failed")
    if len(list((work / "results").glob("*/*-*.json"))) < 2:
        raise CheckFailed("asv stored no results for main or main~1 (did the build fail?)")


def check_page(chromium, sync_playwright, url):
    shot = common.ROOT / ".asv" / "browser-check.png"
    blocked, dialogs = [], []
    with sync_playwright() as playwright:  # its end closes the browser
        page = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"]).new_page(
            viewport={"width": 1400, "height": 1000})
        page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(url)
                   else (blocked.append(route.request.url), route.abort()))
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        page.goto(f"{url}index.html")
        page.wait_for_selector("#summarygrid-display .benchmark-container", timeout=30_000)
        listed = page.eval_on_selector_all("#summarygrid-display .benchmark-container",
                                           "nodes => nodes.map(n => n.getAttribute('href'))")
        if "error.html" in page.url or f"#{GRAPHED}" not in listed:
            raise CheckFailed(f"the dashboard shows no list of {GRAPHED} (blocked: {blocked})")
        page.goto(f"{url}index.html#{GRAPHED}")
        page.wait_for_selector("#main-graph canvas.flot-base", timeout=30_000)
        page.wait_for_timeout(1000)  # an onerror handler runs once the image fails to load
        page.screenshot(path=str(shot))
        shown, images = page.inner_text("#main-graph"), page.locator("#main-graph img").count()
        if dialogs or XSS_TAG not in shown or images:
            raise CheckFailed(f"the tag {XSS_TAG} is not shown as text: dialogs {dialogs}, {images} img "
                              f"elements, the graph's text {shown[:200]!r}")
    if blocked:
        raise CheckFailed(f"the page asked for addresses off this machine: {', '.join(sorted(set(blocked)))}")
    return f"{GRAPHED} listed and graphed, the tag {XSS_TAG} shown as text with no dialog, no request left " \
           f"127.0.0.1; screenshot {shot}"


def setup_arguments(subparsers):
    return subparsers.add_parser("browser-check", allow_abbrev=False,
                                 help="open the dashboard offline in headless Chromium and check it")


def run(args):
    chromium = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    try:
        from playwright.sync_api import Error as PlaywrightError, sync_playwright
    except ImportError:
        sync_playwright = None
    if not chromium or not sync_playwright or not shutil.which("npm"):
        print("SKIPPED browser check: it needs chromium (apt-get install chromium), Playwright (.[browser]) and npm")
        return 0
    work, server = Path(tempfile.mkdtemp(prefix="kv-attention-browser-")), None
    try:
        config = workspace(work)
        make_results(config, work)
        common.run(*common.ASV, "--config", config, "publish")
        publish.finish(work / "html")
        quiet = type("Quiet", (http.server.SimpleHTTPRequestHandler,), {"log_message": lambda *args: None})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(quiet, directory=work / "html"))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        print("browser check passed: " + check_page(chromium, sync_playwright, url))
        return 0
    except (CheckFailed, PlaywrightError) as error:  # Playwright's TimeoutError: what the page did not show in time
        print(f"browser check FAILED: {str(error).strip().splitlines()[0]}", file=sys.stderr)
        return 1
    finally:
        if server is not None:
            server.shutdown()
        shutil.rmtree(work, ignore_errors=True)
