"""``browser-check``: open the asv dashboard in headless Chromium, offline, and check what a person would see.

    python3 tools/dev.py browser-check [--keep]

In a temporary workspace (this checkout's asv.conf.json with results and html
under /tmp; the asv environments of .asv/env are reused) it

1. runs ``asv run --quick`` on main~1 and main (one sample each, gates on),
   and copies main~1's results to older commits of main, so that every
   benchmark has a flat history;
2. introduces a regression: main's ``bench_cache.CacheStrategy.time_decode``
   values are made 3x slower;
3. tags main~1, in a clone of this repository made for the check, with a
   script-injection payload (:data:`XSS_TAG`);
4. publishes the dashboard with a plain ``asv publish``, which the asv
   plugin (loaded from this checkout's tools/) follows with local copies of
   its JavaScript (tools/dashboard.py, npm packages under .asv/npm), the
   default graph views, and repository text shown as text
   (tools/dashboard_text.py); the results of a second machine, those stored
   in docs/results (:data:`SECOND_MACHINE`), are published beside this one's
   as ``tools/dev.py publish --with docs/results`` does (tools/combined.py);
5. serves it on 127.0.0.1 and opens it in Debian's chromium through
   Playwright, with every request that does not go to 127.0.0.1 aborted;
6. asserts: no error page, every benchmark of the suite in the benchmark
   list, a drawn graph on every benchmark's page, the regressed benchmark's
   graph opened on its default view (every strategy, log axis), the
   introduced regression on the regressions page, the tag's text shown over
   the graph as text, no dialog opened and no Content-Security-Policy
   violation (nothing needed the second wall); and both machines listed in
   the machine panel of the summary list (each, once chosen, listing the
   regressed benchmark with a value) and of the regressed benchmark's graph,
   which fetches and draws a line of each machine (another benchmark graphed
   for both, should docs/results hold none of the regressed one's code). Screenshots go to
   .asv/browser-check/.

``--bench REGEX`` limits the quick runs to the benchmarks it selects (it must
select the regressed one); the list and graph checks then cover those.

Exit 0 on success, 1 on a failed check; 0 with a line starting "SKIPPED"
when no Chromium or Playwright or npm is available.
"""

import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from .. import combined, common, dashboard, processes
from ..results import machine_folders

LOCKS_WORKSPACE = True  # it installs commits into .asv/env: one job at a time (tools/lock.py)

REGRESSED = "bench_cache.CacheStrategy.time_decode"
XSS_TAG = '<img/src="x"/onerror="alert(document.domain)">'  # issue 12: asv 0.6.6 pasted tag names as HTML
SLOWER = 3.0
FLAT_HISTORY = 4  # older commits given main~1's results
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
SECOND_MACHINE = Path("docs") / "results"  # the stored results of another machine, published beside this one's


class CheckFailed(Exception):
    """What the browser showed is not what the dashboard must show."""


def find_browser():
    """``(chromium path, playwright sync_playwright)``, or a reason to skip."""
    chromium = next((shutil.which(name) for name in CHROMIUM_NAMES if shutil.which(name)), None)
    if chromium is None:
        return None, "no chromium on PATH (apt-get install chromium)"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None, "Playwright for Python is missing (pip install -e .[browser])"
    if shutil.which("npm") is None:
        return None, "no npm: the dashboard cannot get local copies of its JavaScript, so it needs internet"
    return (chromium, sync_playwright), None


def asv(config, *args, quiet=False):
    """``asv --config CONFIG ARGS`` with this checkout's Python; its exit code."""
    output = subprocess.DEVNULL if quiet else None
    return processes.run([*common.ASV, "--config", str(config), *args], cwd=common.ROOT,
                         stdout=output).returncode


def make_workspace(work):
    """A config whose results and html live in ``work`` and whose envs are this checkout's; its path.

    The repository is a clone of this one (sharing its objects) whose main~1 carries :data:`XSS_TAG`.
    """
    root = common.ROOT
    repo = work / "repo"
    subprocess.run(["git", "clone", "--quiet", "--shared", "--branch", common.BRANCH, str(root), str(repo)],
                   check=True)
    subprocess.run(["git", "-C", str(repo), "tag", XSS_TAG, f"{common.BRANCH}~1"], check=True)
    conf = json.loads((root / "asv.conf.json").read_text())
    conf.update(repo=str(repo), env_dir=str(root / ".asv" / "env"), benchmark_dir=str(root / "benchmarks"),
                results_dir=str(work / "results"), html_dir=str(work / "html"))
    path = work / "asv.conf.json"
    path.write_text(json.dumps(conf, indent=2))
    (work / "tools").symlink_to(root / "tools", target_is_directory=True)  # asv imports ".tools.asv_plugin" here
    return path


def make_results(config, work, bench=None):
    """Quick results for main~1 and main (of the benchmarks ``bench`` selects, default all), main~1's
    copied to older commits, main's REGRESSED slowed."""
    commits = common.git("rev-list", "--first-parent", f"--max-count={FLAT_HISTORY + 2}", common.BRANCH).split()
    if len(commits) < 2:
        raise CheckFailed(f"{common.BRANCH} needs at least 2 commits")
    hashfile = work / "commits.txt"
    hashfile.write_text("\n".join(commits[:2]) + "\n")
    if asv(config, "machine", "--yes", quiet=True) != 0:
        raise CheckFailed("asv machine --yes failed")
    selection = ["--bench", bench] if bench else []
    code = asv(config, "run", "--quick", "--show-stderr", *selection, f"HASHFILE:{hashfile}")
    if code not in (0, 2):  # 2: a benchmark failed; the page must still render
        raise CheckFailed(f"asv run exited {code}")

    head, previous = (sorted((work / "results").glob(f"*/{commit[:8]}-*.json")) for commit in commits[:2])
    if not head or not previous:
        raise CheckFailed("asv stored no results for main or main~1 (did the build fail?)")
    for older in commits[2:]:  # asv's result files are JSON named <machine>/<commit[:8]>-<env>.json
        for path in previous:
            stored = json.loads(path.read_text())
            stored["commit_hash"] = older
            path.with_name(older[:8] + path.name[8:]).write_text(json.dumps(stored))
    if not any(REGRESSED in json.loads(path.read_text())["results"] for path in head):
        raise CheckFailed(f"no results of {REGRESSED}, the benchmark the check slows: --bench must select it")
    for path in head:
        stored = json.loads(path.read_text())
        if REGRESSED in stored["results"]:
            values = stored["results"][REGRESSED][0]  # the "result" column: one value per parameter combination
            stored["results"][REGRESSED][0] = [None if v is None else SLOWER * v for v in values]
            path.write_text(json.dumps(stored))


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Serves files without a log line per request."""

    def log_message(self, *args):
        pass


def serve(directory):
    """An HTTP server for ``directory`` on 127.0.0.1, on a free port, in a daemon thread."""
    handler = functools.partial(QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def machine_names(results_dir):
    """The asv names (machine.json's ``machine``) of the machines in ``results_dir``."""
    return sorted(combined.machine_name(path) for path in machine_folders(results_dir).values())


def publish(config, work):
    """Publish the workspace's results with :data:`SECOND_MACHINE`'s beside them; the machines published.

    docs/results' machines other than this one (a copy of their folders, where docs/results holds this
    machine too); only this machine's when it holds no other (the check then says so).
    """
    second = common.ROOT / SECOND_MACHINE
    ours = machine_names(work / "results")
    theirs = machine_names(second) if second.is_dir() else []
    if set(theirs) & set(ours):  # docs/results holds this machine too: the others beside this one's
        others = work / "second"
        others.mkdir()
        for path in machine_folders(second).values():
            if combined.machine_name(path) not in ours:
                shutil.copytree(path, others / os.path.basename(path))
        shutil.copy(second / "benchmarks.json", others / "benchmarks.json")
        second, theirs = others, [n for n in theirs if n not in ours]
    if not theirs:
        print(f"note: one machine only: {SECOND_MACHINE} holds no machine but this one "
              f"({', '.join(ours)})", flush=True)
        if asv(config, "publish") != 0:
            raise CheckFailed("asv publish failed")
        return ours
    try:
        _, published = combined.publish_together([second], config=config)
    except common.UserError as error:
        raise CheckFailed(f"publishing with {SECOND_MACHINE} failed: {error}") from None
    return sorted(name for name, *_ in published)


def panel_buttons(page, container):
    """``[(text, active)]`` of the buttons of the "machine" panel in ``container``."""
    return [tuple(b) for b in page.evaluate("""container => {
        const panel = Array.from(document.querySelectorAll(container + ' .panel')).find(
            p => p.querySelector('.panel-heading').textContent.trim() === 'machine');
        return panel ? Array.from(panel.querySelectorAll('a.btn')).map(
            a => [a.textContent, a.classList.contains('active')]) : [];
    }""", container)]


# The cells of the summary list's table on show (asv keeps the tables of earlier choices, hidden).
SHOWN_ROWS = """() => {
    const table = Array.from(document.querySelectorAll('#summarylist-body table'))
        .find(t => t.offsetParent !== null);
    return table ? Array.from(table.querySelectorAll('tbody tr')).map(
        r => Array.from(r.querySelectorAll('td')).map(td => td.textContent.trim())) : [];
}"""


def compared_benchmark(html_dir, machines):
    """The benchmark the machines check looks at: :data:`REGRESSED`, or another that every machine has a graph of.

    asv graphs a result only while its benchmark's code is that of the suite's benchmarks.json, so the
    stored results of docs/results may lack some: CheckFailed if no benchmark is graphed for every machine.
    """
    graphs = combined.graphed(html_dir)
    shared = set.intersection(*(combined.graphs_of(graphs, name) for name in machines))
    if not shared:
        raise CheckFailed(f"no benchmark is graphed for every machine ({', '.join(machines)}): the stored "
                          f"results of {SECOND_MACHINE} are all of other benchmark versions than the suite's")
    return REGRESSED if REGRESSED in shared else min(shared)


def check_machines(page, url, machines, graph_files, benchmark=REGRESSED):
    """CheckFailed unless the summary list and ``benchmark``'s graph list every machine and show its results.

    ``graph_files`` collects the graph files the page fetched (status, address), since it opened.
    """
    page.goto(f"{url}index.html#summarylist")
    page.wait_for_function(f"() => ({SHOWN_ROWS})().length > 0", timeout=30_000)
    listed = [name for name, _ in panel_buttons(page, "#summarylist-navigation")]
    if listed != machines:
        raise CheckFailed(f"the summary list's machine panel shows {listed}, not {machines}")
    for name in machines:
        page.click(f"#summarylist-navigation a.btn:text-is('{name}')")
        page.wait_for_function("name => decodeURIComponent(window.location.hash).includes('machine=' + name)",
                               arg=name, timeout=10_000)
        page.wait_for_function(f"() => ({SHOWN_ROWS})().length > 0", timeout=30_000)
        if dict(panel_buttons(page, "#summarylist-navigation")).get(name) is not True:
            raise CheckFailed(f"choosing {name} in the summary list did not make it the machine shown")
        rows = page.evaluate(SHOWN_ROWS)
        values = [row[1] for row in rows if len(row) > 1 and row[0].startswith(benchmark)]
        if not values or not all(values):
            raise CheckFailed(f"the summary list of {name} shows no value of {benchmark}: {rows[:3]}")
        page.screenshot(path=str(common.ROOT / ".asv" / "browser-check" / f"summarylist-{name}.png"))
    page.goto(f"{url}index.html#{benchmark}")
    page.wait_for_selector("#main-graph canvas.flot-base", timeout=30_000)
    page.wait_for_function("() => window.location.hash.includes('?')", timeout=10_000)
    page.wait_for_timeout(500)
    buttons = panel_buttons(page, "#graphdisplay-state-params")
    if buttons != [(name, True) for name in machines]:
        raise CheckFailed(f"the graph's machine panel shows {buttons}, not every one of {machines} chosen")
    legend = page.inner_text("#main-graph")
    page.screenshot(path=str(common.ROOT / ".asv" / "browser-check" / "machines-graph.png"))
    for name in machines:
        fetched = [status for status, address in graph_files
                   if f"/machine-{name}/" in address and f"/{benchmark}.json" in address]
        if fetched != [200] * len(fetched) or not fetched or f"machine-{name}" not in legend:
            raise CheckFailed(f"the graph of {benchmark} draws no line of machine {name} "
                              f"(its graph file fetched: {fetched})")


def check_page(chromium, sync_playwright, url, benchmarks, machines, compared=REGRESSED):
    """Drive the dashboard; CheckFailed on the first thing missing. Returns a summary line."""
    screenshots = common.ROOT / ".asv" / "browser-check"
    screenshots.mkdir(parents=True, exist_ok=True)
    blocked = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})

            def offline(route):
                if route.request.url.startswith(url):
                    return route.continue_()
                blocked.append(route.request.url)
                return route.abort()

            page.route("**/*", offline)
            dialogs, violations, graph_files = [], [], []
            page.on("response", lambda response: graph_files.append((response.status, response.url))
                    if "/graphs/" in response.url else None)
            page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
            page.on("console", lambda message: violations.append(message.text)
                    if "Content Security Policy" in message.text else None)
            page.goto(url + "index.html")
            page.wait_for_selector("#summarygrid-display .benchmark-container", timeout=30_000)
            if "error.html" in page.url:
                raise CheckFailed(f"the dashboard showed its error page (blocked: {blocked})")
            listed = set(page.eval_on_selector_all(
                "#summarygrid-display .benchmark-container", "nodes => nodes.map(n => n.getAttribute('href'))"))
            missing = sorted(name for name in benchmarks if f"#{name}" not in listed)
            if missing:
                raise CheckFailed(f"benchmarks missing from the list: {', '.join(missing)}")
            page.screenshot(path=str(screenshots / "summary.png"))
            for name in benchmarks:
                page.goto(f"{url}index.html#{name}")
                try:
                    page.wait_for_selector("#main-graph canvas.flot-base", timeout=30_000)
                except Exception:
                    raise CheckFailed(f"no graph drawn for {name}") from None
                page.evaluate("() => { window.location.hash = ''; }")
            page.goto(f"{url}index.html#{REGRESSED}")
            page.wait_for_selector("#main-graph canvas.flot-base", timeout=30_000)
            page.wait_for_function("() => window.location.hash.includes('?')", timeout=10_000)
            page.screenshot(path=str(screenshots / "graph.png"))
            view = page.evaluate("() => decodeURIComponent(window.location.hash)")
            if "y-axis-scale=log" not in view or view.count("p-strategy=") != 3 or not page.eval_on_selector(
                    "#log-scale", "node => node.classList.contains('active')"):
                raise CheckFailed(f"{REGRESSED} did not open on its default view (every strategy, log axis): {view}")
            check_tag_is_text(page, dialogs, violations)
            page.goto(f"{url}index.html#regressions")
            page.wait_for_selector("#regressions-body table", timeout=30_000)
            table = page.inner_text("#regressions-body")
            page.screenshot(path=str(screenshots / "regressions.png"))
            if REGRESSED not in table:
                raise CheckFailed(f"the regressions page does not list {REGRESSED}: {table[:300]!r}")
            check_machines(page, url, machines, graph_files, compared)
        finally:
            browser.close()
    if blocked:
        raise CheckFailed(f"the page asked for addresses off this machine: {', '.join(sorted(set(blocked)))}")
    return (f"{len(benchmarks)} benchmarks listed and graphed, {REGRESSED} on the regressions page, "
            f"the tag {XSS_TAG} shown as text with no dialog, {len(machines)} machines ({', '.join(machines)}) "
            f"listed in the summary list and in the machine panel of {compared}'s graph, each with its values "
            "and its line, "
            f"no request left 127.0.0.1; screenshots in {screenshots}")


def check_tag_is_text(page, dialogs, violations):
    """CheckFailed unless the graph shows :data:`XSS_TAG` as text, made no element of it and opened no dialog."""
    page.wait_for_timeout(500)  # an onerror handler runs once the image fails to load
    shown = page.inner_text("#main-graph")
    images = page.locator("#main-graph img").count()
    if dialogs:
        raise CheckFailed(f"the tag {XSS_TAG} ran script: a dialog opened ({dialogs})")
    if XSS_TAG not in shown or images:
        raise CheckFailed(f"the tag {XSS_TAG} is not shown as text over the graph ({images} img elements; "
                          f"the graph's text: {shown[:200]!r})")
    if violations:
        raise CheckFailed(f"the Content-Security-Policy blocked something: {violations[:3]}")


def setup_arguments(subparsers):
    parser = subparsers.add_parser("browser-check", allow_abbrev=False,
                                   help="open the dashboard offline in headless Chromium and check it")
    parser.add_argument("--keep", action="store_true", help="keep the temporary workspace")
    parser.add_argument("--bench", metavar="REGEX",
                        help=f"quick-run only these benchmarks (asv run --bench; must select {REGRESSED})")
    return parser


def run(args):
    found, reason = find_browser()
    if found is None:
        print(f"SKIPPED browser check: {reason}")
        return 0
    work = Path(tempfile.mkdtemp(prefix="kv-attention-browser-"))
    server = None
    try:
        config = make_workspace(work)
        make_results(config, work, args.bench)
        machines = publish(config, work)
        html = (work / "html" / "index.html").read_text()
        if dashboard.TAG.search(html) or dashboard.VIEWS_SCRIPT not in html or "Content-Security-Policy" not in html:
            raise CheckFailed("a plain asv publish left CDN links, no default views or no Content-Security-Policy: "
                              "the asv plugin did not run")
        count = sum(1 for path in (work / "html" / "vendor").rglob("*") if path.is_file())
        benchmarks = sorted(k for k in json.loads((work / "results" / "benchmarks.json").read_text()) if k != "version")
        if args.bench:  # only those measured
            measured = {k for path in (work / "results").glob("*/*.json") if path.name != "machine.json"
                        for k in json.loads(path.read_text())["results"]}
            benchmarks = [k for k in benchmarks if k in measured]
        server = serve(work / "html")
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        print(f"dashboard with {count} local JavaScript/CSS files served at {url}", flush=True)
        try:
            summary = check_page(*found, url, benchmarks, machines, compared_benchmark(work / "html", machines))
        except Exception as error:  # Playwright's TimeoutError and Error: what the page did not show in time
            if isinstance(error, CheckFailed) or type(error).__module__.split(".")[0] != "playwright":
                raise
            first = (str(error).strip().splitlines() or [type(error).__name__])[0]
            raise CheckFailed(f"the page did not show what was awaited: {first}") from None
        print("browser check passed: " + summary)
        return 0
    except CheckFailed as error:
        print(f"browser check FAILED: {error}", file=sys.stderr)
        return 1
    finally:
        if server is not None:
            server.shutdown()
        if args.keep:
            print(f"workspace kept at {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
