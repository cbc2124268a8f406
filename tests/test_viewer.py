"""The viewer as people use it: `neuron-support report` run as a command, the page opened from disk
in a real headless Chromium (Debian's ``chromium`` + ``chromium-driver``, driven by Selenium), the
Hub rankings served by the loopback Hub (``tests/hubserver.py``) through ``HF_ENDPOINT``.

Nothing is patched: the report is a subprocess, the Hub is a real HTTP server, the browser is a
real browser with networking switched off. A screenshot of the page is kept under
``tests/artifacts/`` (git-ignored) as evidence of what a person sees.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from hubserver import HubServer, ModelRecord

from pytest_neuron_support.data.dataset import DATA_DIR, write_rows
from pytest_neuron_support.data.records import COLUMN_TYPES, Row
from pytest_neuron_support.run import neffcache
from pytest_neuron_support.tasks.table import RANKED_TASKS
from pytest_neuron_support.viewer import report as viewer

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
CANARY = "hf_CanaryTokenDoNotLeak0123456789"
#: The SHA-256 of the Authorization header a client sends with the canary (the loopback Hub keeps only that).
BEARER = hashlib.sha256(f"Bearer {CANARY}".encode()).hexdigest()
XSS = '<script>window.__xss = 1</script><img src=x onerror="window.__xss = 2">'

OLD, NEW = "5.24.0", "5.25.0"
CC = "2.21.33"

CATALOG = """
models:
  - id: org/alpha-1b
    task: text-generation
    tags: [dense]
  - id: org/beta-7b
    task: text-generation
    extra_packages: ["einops>=0.8"]
  - id: org/gamma-vl
    task: image-text-to-text
  - id: org/huge-400b
    task: text-generation
    exclude:
      reason: too-large
      note: "needs 32 cores"
  - id: org/never-run
    task: text-generation
"""

HUB_MODELS = [
    ModelRecord("org/alpha-1b", downloads=900, likes=9, trending_score=50, pipeline_tag="text-generation"),
    ModelRecord("org/huge-400b", downloads=800, likes=8, trending_score=40, pipeline_tag="text-generation"),
    ModelRecord("hub/fresh-model", downloads=5000, likes=7, trending_score=30, pipeline_tag="text-generation"),
    ModelRecord("org/gamma-vl", downloads=100, likes=1, trending_score=5, pipeline_tag="image-text-to-text"),
    ModelRecord("hub/other-vlm", downloads=10, likes=0, trending_score=1, pipeline_tag="image-text-to-text"),
]

RUNSCRIPT = "#!/usr/bin/env python3\n# run.py of {model}\nSPEC = {{'model': '{model}'}}\nprint('x < y && z > w')\n"


#: Dynamo's warning, as run.py keeps it (its first three lines).
RECOMPILE_LIMIT = (
    "torch._dynamo hit config.recompile_limit (8); function: 'forward' (modeling_gemma3.py:500); "
    "last reason: 0/7: kwargs['cache'].layers[0].cumulative_length_int == 37"
)


def make_row(model: str, result: str, version: str, **kwargs: Any) -> Row:
    defaults: dict[str, Any] = {
        "model_id": model,
        "result": result,
        "library_version": version,
        "neuronx_cc": CC,
        "torch_neuronx": "2.9.0.2.10",
        "torch": "2.9.0",
        "python": "3.11.7",
        "device": "neuron",
        "neuron_cores": 1,
        "tp_size": 1,
        "ep_size": 1,
        "timestamp": f"2026-11-30T0{1 if version == OLD else 2}:00:00+00:00",
        "runscript": RUNSCRIPT.format(model=model),
    }
    defaults.update(kwargs)
    return Row(**defaults)


def dataset_rows() -> list[Row]:
    return [
        make_row(
            "org/alpha-1b",
            "PASS",
            OLD,
            parameters=1_000_000_000,
            weight_bytes=2_000_000_000,
            run_s=120.0,
            load_s=20.0,
            compile_s=80.0,
            generate_s=5.0,
            peak_device_memory_bytes=3 * 2**30,
        ),
        make_row(
            "org/beta-7b",
            "ERROR",
            OLD,
            failure_stage="compile",
            error=f"RuntimeError: {XSS}",
            parameters=7_000_000_000,
            run_s=600.0,
            neuron_cores=4,
            tp_size=4,
        ),
        make_row(
            "org/gamma-vl",
            "FAIL",
            OLD,
            task="image-text-to-text",
            failure_stage="parity",
            parameters=3_000_000_000,
            run_s=300.0,
        ),
        make_row("org/alpha-1b", "TIMEOUT", NEW, failure_stage="compile", parameters=10**9, run_s=3600.0),
        make_row(
            "org/beta-7b",
            "PASS",
            NEW,
            parameters=7 * 10**9,
            run_s=400.0,
            compile_s=300.0,
            load_s=50.0,
            generate_s=10.0,
            neuron_cores=4,
            tp_size=4,
            graphs_compiled=8,
            excess_graphs=7,
            recompile_limit=RECOMPILE_LIMIT,
        ),
        make_row("cli/extra-model", "PASS", NEW, source="cli", parameters=5 * 10**8, run_s=60.0),
    ]


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest_neuron_support.cli", *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("viewer")
    write_rows(base / "results", dataset_rows())
    (base / "models.yaml").write_text(CATALOG, encoding="utf-8")
    return base


@pytest.fixture(scope="module")
def site(dataset: Path) -> Path:
    """`neuron-support report` against the loopback Hub, with a token in the environment."""
    with HubServer(HUB_MODELS) as server:
        done = cli(
            "report",
            "--results-dir",
            str(dataset / "results"),
            "--models-file",
            str(dataset / "models.yaml"),
            "--out",
            str(dataset / "site"),
            "--limit",
            "10",
            env={**server.env(), "HF_TOKEN": CANARY},
        )
        # One listing per (task, sort); the client may also ask for its own registry (agent-harnesses).
        listings = server.requests_to("/api/models")
        # The token did leave the report for the Hub (so a page without it is one that kept it out).
        assert {r.authorization_sha256 for r in listings} == {BEARER}, "the report sent the Hub no token"
        assert sorted((r.param("pipeline_tag"), r.param("sort")) for r in listings) == sorted(
            (task, sort) for task in RANKED_TASKS for sort in ("trendingScore", "downloads")
        )
    assert done.returncode == 0, done.stderr
    assert "Hub rankings unavailable" not in done.stdout
    return dataset / "site"


def embedded(index: Path) -> dict[str, Any]:
    html = index.read_text(encoding="utf-8")
    match = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.S)
    assert match is not None
    data: dict[str, Any] = json.loads(match.group(1))
    return data


# --- the files the report writes ---------------------------------------------------------------


def test_report_writes_a_self_contained_site(site: Path) -> None:
    assert sorted(p.name for p in site.iterdir()) == ["README.md", "hub-rankings.json", "index.html"]
    html = (site / "index.html").read_text(encoding="utf-8")
    # Nothing is loaded from anywhere: no external script, stylesheet, image or fetch.
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", html)
    assert "fetch(" not in html and "XMLHttpRequest" not in html
    assert "default-src 'none'" in html
    card = yaml.safe_load((site / "README.md").read_text(encoding="utf-8").split("---")[1])
    assert card["sdk"] == "static" and card["app_file"] == "index.html"


def test_embedded_data_joins_catalog_rows_and_hub(site: Path) -> None:
    data = embedded(site / "index.html")
    assert [s["library_version"] for s in data["stacks"]] == [OLD, NEW]
    assert data["default_stack"] == f"neuronxcc-{CC}__transformers-{NEW}"  # the newest
    assert [m["id"] for m in data["catalog"]["models"]][-2:] == ["org/huge-400b", "org/never-run"]
    assert data["catalog"]["models"][3]["exclude_reason"] == "too-large"
    trending = [r for r in data["hub"]["rankings"] if (r["task"], r["sort"]) == ("text-generation", "trending")]
    assert [m["id"] for m in trending[0]["models"]] == ["org/alpha-1b", "org/huge-400b", "hub/fresh-model"]
    assert all(r["error"] is None for r in data["hub"]["rankings"])
    # The page shows the very fetches saved for reuse (--hub-snapshot): same times, same durations.
    saved = json.loads((site / "hub-rankings.json").read_text(encoding="utf-8"))["rankings"]
    timing = [(r["task"], r["sort"], r["fetched_at"], r["elapsed_s"]) for r in data["hub"]["rankings"]]
    assert timing == [(r["task"], r["sort"], r["fetched_at"], r["elapsed_s"]) for r in saved]
    beta = next(r for r in data["rows"] if r["model_id"] == "org/beta-7b" and r["library_version"] == NEW)
    assert beta["install"][-1] == f"pip install torch==2.9.0 transformers=={NEW} 'einops>=0.8'"
    assert (
        beta["sync"] == f"hf buckets sync hf://buckets/aws-neuron/torch-neuronx-neff-cache/neuronxcc-{CC}"
        f" /tmp/neff_cache/neuronxcc-{CC}"
    )


def test_one_schema_drives_the_columns(site: Path) -> None:
    data = embedded(site / "index.html")
    assert [c["name"] for c in data["columns"]] == list(COLUMN_TYPES)
    for name in (*viewer.TABLE_COLUMNS, *viewer.DETAIL_COLUMNS, *viewer.SPLIT_COLUMNS):
        assert name in COLUMN_TYPES, name
    assert set(data["results"]) == {"PASS", "FAIL", "ERROR", "TIMEOUT", "SKIPPED", "EXCLUDED"}


def test_tokens_appear_nowhere(site: Path) -> None:
    for path in site.iterdir():
        assert CANARY not in path.read_text(encoding="utf-8"), path


# The Hub's user tokens look like the first; the second is a token of no known shape (an older org
# token, a proxy's own): it is a secret because HF_TOKEN holds it, not because of how it looks.
@pytest.mark.parametrize("token", [CANARY, "api_org_CanaryTokenDoNotLeak0123456789"], ids=["hf-shaped", "other"])
def test_a_token_the_hub_echoes_back_reaches_no_file_or_output_of_the_report(
    dataset: Path, tmp_path: Path, token: str
) -> None:
    """The canary on a path where it can leak: the report sends it to the Hub, and the Hub's error
    answers quote it back (a proxy or an auth error that echoes its header). The page shows the error,
    masked; no file the report writes and nothing it prints holds the token."""
    with HubServer(HUB_MODELS) as server:
        server.fail_with = 401
        server.fail_path = "/api/models"
        server.fail_message = f"Invalid credentials in Authorization header: Bearer {token}"
        done = cli(
            "report",
            "--results-dir",
            str(dataset / "results"),
            "--models-file",
            str(dataset / "models.yaml"),
            "--out",
            str(tmp_path / "site"),
            "--hub-timeout",
            "5",
            env={**server.env(), "HF_TOKEN": token},
        )
        sent = {r.authorization_sha256 for r in server.requests_to("/api/models")}
    assert done.returncode == 0, done.stderr
    assert sent == {hashlib.sha256(f"Bearer {token}".encode()).hexdigest()}  # out it went; the answers quote it
    shown = json.dumps(embedded(tmp_path / "site" / "index.html")["hub"])
    assert re.search(r"Invalid credentials in Authorization header: Bearer (hf_)?\*\*\*", shown), shown[:2000]
    assert token not in done.stdout + done.stderr
    for path in (tmp_path / "site").iterdir():
        assert token not in path.read_text(encoding="utf-8"), path


def test_markup_in_data_cannot_close_the_script(site: Path) -> None:
    html = (site / "index.html").read_text(encoding="utf-8")
    assert "window.__xss" in html  # the error is there...
    assert "<script>window.__xss" not in html and "<img src=x" not in html  # ...but never as markup
    assert html.count("</script>") == 2  # the data tag and the code tag, nothing smuggled


def test_embed_json_round_trips_hostile_text() -> None:
    hostile = {"a": "</script><!-- & \u2028 \u2029 >", "n": float("nan")}
    text = viewer.embed_json({"a": hostile["a"]})
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"a": hostile["a"]}


# --- the Hub failing or skipped ----------------------------------------------------------------


def test_hub_down_still_renders_and_says_why(dataset: Path, tmp_path: Path) -> None:
    with HubServer(HUB_MODELS) as server:
        server.fail_with = 500
        server.retry_after = 0
        done = cli(
            "report",
            "--results-dir",
            str(dataset / "results"),
            "--models-file",
            str(dataset / "models.yaml"),
            "--out",
            str(tmp_path / "site"),
            "--hub-timeout",
            "2",
            env=server.env(),
        )
        server.heal()
    assert done.returncode == 0, done.stderr
    assert "Hub rankings unavailable" in done.stdout
    data = embedded(tmp_path / "site" / "index.html")
    assert data["hub"]["unavailable"] and "500" in data["hub"]["unavailable"]
    assert len(data["rows"]) == len(dataset_rows())


def test_unreachable_hub_and_no_hub(dataset: Path, tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    args = ("report", "--results-dir", str(dataset / "results"), "--models-file", str(dataset / "models.yaml"))
    done = cli(
        *args,
        "--out",
        str(tmp_path / "a"),
        "--hub-timeout",
        "2",
        env={"HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_HUB_OFFLINE": "0"},
    )
    assert done.returncode == 0, done.stderr
    # One connection attempt for all rankings, said once (not a deadline per ranking).
    unavailable = embedded(tmp_path / "a" / "index.html")["hub"]["unavailable"]
    assert unavailable == f"not fetched: http://127.0.0.1:{port} is unreachable (Connection refused)", unavailable
    done = cli(*args, "--out", str(tmp_path / "b"), "--no-hub")
    assert done.returncode == 0, done.stderr
    assert embedded(tmp_path / "b" / "index.html")["hub"]["unavailable"] == "not fetched (--no-hub)"
    assert not (tmp_path / "b" / "hub-rankings.json").exists()


def test_saved_snapshot_is_reused(site: Path, dataset: Path, tmp_path: Path) -> None:
    done = cli(
        "report",
        "--results-dir",
        str(dataset / "results"),
        "--models-file",
        str(dataset / "models.yaml"),
        "--out",
        str(tmp_path / "again"),
        "--hub-snapshot",
        str(site / "hub-rankings.json"),
    )
    assert done.returncode == 0, done.stderr
    again = embedded(tmp_path / "again" / "index.html")["hub"]
    assert again["source"] == "snapshot"
    assert again["rankings"] == embedded(site / "index.html")["hub"]["rankings"]
    broken = tmp_path / "broken.json"
    broken.write_text("{}", encoding="utf-8")
    done = cli(
        "report", "--results-dir", str(dataset / "results"), "--out", str(tmp_path / "c"), "--hub-snapshot", str(broken)
    )
    assert done.returncode == 0, done.stderr
    assert "cannot read the Hub snapshot" in embedded(tmp_path / "c" / "index.html")["hub"]["unavailable"]


def test_report_on_a_missing_dataset_and_a_bad_catalog(tmp_path: Path) -> None:
    # A mistyped results folder is an error, not an empty site to publish.
    done = cli("report", "--results-dir", str(tmp_path / "none"), "--out", str(tmp_path / "site"), "--no-hub")
    assert done.returncode == 2 and "holds no dataset: the folder does not exist" in done.stderr, done.stderr
    assert not (tmp_path / "site").exists()
    write_rows(tmp_path / "results", [make_row("org/m", "PASS", NEW)])
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [{id: 'not an id'}]\n", encoding="utf-8")
    done = cli(
        "report", "--results-dir", str(tmp_path / "results"), "--models-file", str(bad), "--out", str(tmp_path / "x")
    )
    assert done.returncode == 2 and "bad.yaml" in done.stderr


# --- the dataset and its card agree ------------------------------------------------------------


def test_read_parquet_and_the_cards_configs_agree_on_the_files(dataset: Path) -> None:
    results = dataset / "results"
    front = (results / "README.md").read_text(encoding="utf-8").split("---\n")[1]
    configs = {c["config_name"]: c["data_files"] for c in yaml.safe_load(front)["configs"]}
    files = sorted(p.relative_to(results).as_posix() for p in (results / DATA_DIR).glob("*.parquet"))
    per_stack = sorted(files_[0]["path"] for name, files_ in configs.items() if name != "default")
    assert per_stack == files
    assert {name for name in configs if name != "default"} == {Path(f).stem for f in files}
    assert sorted(p.relative_to(results).as_posix() for p in results.glob(configs["default"][0]["path"])) == files
    everything = pd.read_parquet(results / DATA_DIR)
    assert len(everything) == sum(len(pd.read_parquet(results / f)) for f in per_stack) == len(dataset_rows())
    assert sorted(everything.library_version.unique()) == [OLD, NEW]


# --- reproduction text shared with `runscript` -------------------------------------------------


def test_reproduction_of_a_neuron_row() -> None:
    row = make_row("org/m", "PASS", NEW, neuron_cores=4, torch="2.9.0+cpu")
    again = viewer.reproduction(row, ("einops",))
    assert again.install == (
        f"pip install --extra-index-url {viewer.NEURON_PIP_INDEX} neuronx-cc=={CC} torch-neuronx==2.9.0.2.10",
        f"pip install torch==2.9.0 transformers=={NEW} einops",
    )
    assert again.sync == f"hf buckets sync {neffcache.DEFAULT_BUCKET}/neuronxcc-{CC} /tmp/neff_cache/neuronxcc-{CC}"
    assert again.run == (
        f"NEURON_RT_VISIBLE_CORES=0-3 TORCH_NEURONX_NEFF_CACHE_DIR=/tmp/neff_cache/neuronxcc-{CC} python3 run.py"
        " --out result.json"
    )
    assert again.sync in again.instructions() and again.run in again.instructions()


def test_reproduction_off_trainium() -> None:
    row = Row(model_id="org/m", result="PASS", device="cpu", torch="2.13.0", library_version=NEW)
    again = viewer.reproduction(row)
    assert again.install == (f"pip install torch==2.13.0 transformers=={NEW}",)
    assert again.sync is None
    assert again.run == "python3 run.py --out result.json"
    cuda = viewer.reproduction(Row(model_id="org/m", result="PASS", device="cuda", neuron_cores=2))
    assert cuda.run == "CUDA_VISIBLE_DEVICES=0,1 python3 run.py --out result.json"


def test_viewer_does_not_import_torch_or_transformers() -> None:
    code = (
        "import sys; import pytest_neuron_support.viewer.report, pytest_neuron_support.cli\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


# --- in a real browser -------------------------------------------------------------------------


#: Set to 1 (``.ci/run`` does) to make a missing browser fail the browser tests instead of
#: skipping them: a skip passes, so CI without Chromium would never open the viewer.
REQUIRE_BROWSER = "NEURON_SUPPORT_REQUIRE_BROWSER"


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        missing = (
            "BROWSER TESTS NOT RUN: /usr/bin/chromium or /usr/bin/chromedriver is missing; "
            "install them with `apt-get install -y --no-install-recommends chromium chromium-driver` (.ci/run does)"
        )
        if os.environ.get(REQUIRE_BROWSER) == "1":
            pytest.fail(f"{missing}; {REQUIRE_BROWSER}=1 requires them", pytrace=False)
        pytest.skip(missing)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # An explicit driver path: Selenium Manager (which would go to the network) never runs.
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(predicate: Any, timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def table(driver: Any) -> dict[str, str]:
    """model id -> result, as the table shows them now."""
    from selenium.webdriver.common.by import By

    return {
        tr.get_attribute("data-model"): tr.get_attribute("data-result")
        for tr in driver.find_elements(By.CSS_SELECTOR, "#models tbody tr")
    }


@pytest.fixture
def page(browser: Any, site: Path) -> Any:
    browser.get((site / "index.html").as_uri())
    assert wait_for(lambda: browser.execute_script("return document.body.dataset.ready") == "true")
    return browser


def test_page_opens_from_disk_with_no_errors_and_no_requests(page: Any) -> None:
    assert page.current_url.startswith("file://")
    assert page.execute_script("return performance.getEntriesByType('resource').length") == 0
    logs = [entry for entry in page.get_log("browser") if entry["level"] == "SEVERE"]
    assert logs == []


def test_selected_view_joins_the_catalog_with_the_newest_stack(page: Any) -> None:
    assert table(page) == {
        "org/alpha-1b": "TIMEOUT",
        "org/beta-7b": "PASS",
        "org/gamma-vl": "not tested",
        "org/huge-400b": "EXCLUDED",
        "org/never-run": "not tested",
        "cli/extra-model": "PASS",
    }
    # Headers explain themselves with the schema's own docs.
    from selenium.webdriver.common.by import By

    header = page.find_element(By.XPATH, "//th[@data-column='neuron_cores']")
    assert header.get_attribute("title") == "cores (devices off Trainium) the run used"
    # The Space's headline columns first, with human labels and units, not raw field names.
    heads = [th.text for th in page.find_elements(By.CSS_SELECTOR, "#models thead th")]
    assert heads[:5] == ["Model", "Result", "Cores", "Run time incl. compile (s)", "Peak device memory"], heads


def test_search_filters_rows(page: Any) -> None:
    from selenium.webdriver.common.by import By

    page.find_element(By.ID, "search").send_keys("BETA")
    assert wait_for(lambda: list(table(page)) == ["org/beta-7b"])
    page.find_element(By.ID, "search").clear()
    page.find_element(By.ID, "search").send_keys("zzz")
    assert wait_for(lambda: table(page) == {})
    assert page.find_element(By.ID, "empty").is_displayed()


def test_version_selector_switches_stack(page: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(page.find_element(By.ID, "library")).select_by_visible_text(f"transformers {OLD}")
    assert wait_for(lambda: table(page).get("org/alpha-1b") == "PASS")
    assert table(page) == {
        "org/alpha-1b": "PASS",
        "org/beta-7b": "ERROR",
        "org/gamma-vl": "FAIL",
        "org/huge-400b": "EXCLUDED",
        "org/never-run": "not tested",
        "cli/extra-model": "not tested",
    }
    assert f"transformers {OLD}" in page.find_element(By.ID, "stack-info").text
    # The failure stage carries its definition, the plot shows this stack's three measured rows.
    assert len(page.find_elements(By.CSS_SELECTOR, "#plot circle[data-model]")) == 3
    Select(page.find_element(By.ID, "task")).select_by_value("image-text-to-text")
    assert wait_for(lambda: table(page) == {"org/gamma-vl": "FAIL"})


def test_hostile_error_renders_as_text(page: Any) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    Select(page.find_element(By.ID, "library")).select_by_visible_text(f"transformers {OLD}")
    cell = page.find_element(By.CSS_SELECTOR, "tr[data-model='org/beta-7b'] td.error")
    assert cell.text == f"RuntimeError: {XSS}"
    assert page.execute_script("return window.__xss === undefined")
    assert page.find_elements(By.CSS_SELECTOR, "#models img") == []


def test_a_pass_past_the_recompile_limit_is_flagged_with_the_guard(page: Any) -> None:
    from selenium.webdriver.common.by import By

    flag = page.find_element(By.CSS_SELECTOR, "tr[data-model='org/beta-7b'] span.flag.graphs")
    assert flag.text == "+7 graphs (recompile limit: eager)"
    title = flag.get_attribute("title")
    assert title.endswith(f"; later steps ran uncompiled: {RECOMPILE_LIMIT} (recompile_limit)"), title
    # A PASS with neither excess graphs nor the limit has no flag.
    assert page.find_elements(By.CSS_SELECTOR, "tr[data-model='cli/extra-model'] span.flag") == []


def test_trending_view_shows_hub_models_tested_or_not(page: Any) -> None:
    from selenium.webdriver.common.by import By

    page.find_element(By.ID, "view-trending").click()
    assert wait_for(lambda: "hub/fresh-model" in table(page))
    assert table(page) == {
        "org/alpha-1b": "TIMEOUT",
        "org/huge-400b": "EXCLUDED",
        "hub/fresh-model": "not tested",
        "org/gamma-vl": "not tested",
        "hub/other-vlm": "not tested",
    }
    ids = [tr.get_attribute("data-model") for tr in page.find_elements(By.CSS_SELECTOR, "#models tbody tr")]
    assert ids[:3] == ["org/alpha-1b", "org/huge-400b", "hub/fresh-model"]  # the Hub's order
    huge = page.find_element(By.CSS_SELECTOR, "tr[data-model='org/huge-400b']")
    assert "too-large: needs 32 cores" in huge.text
    assert "Hub snapshot taken" in page.find_element(By.ID, "hub-info").text
    page.find_element(By.ID, "view-downloads").click()
    assert wait_for(lambda: next(iter(table(page)), None) == "hub/fresh-model")  # most downloads first


def test_model_detail_shows_runscript_and_how_to_rerun(page: Any) -> None:
    from selenium.webdriver.common.by import By

    page.find_element(By.CSS_SELECTOR, "button.model[data-model='org/beta-7b']").click()
    detail = page.find_element(By.ID, "detail")
    assert wait_for(detail.is_displayed)
    # run.py is collapsed (what the row produced comes first); its summary opens it.
    box = page.find_element(By.ID, "runscript-box")
    assert box.get_attribute("open") is None and not page.find_element(By.ID, "runscript").is_displayed()
    box.find_element(By.TAG_NAME, "summary").click()
    assert wait_for(page.find_element(By.ID, "runscript").is_displayed)
    assert page.find_element(By.ID, "runscript").text == RUNSCRIPT.format(model="org/beta-7b").rstrip("\n")
    assert "einops>=0.8" in page.find_element(By.ID, "install").text
    assert page.find_element(By.ID, "sync").text == (
        f"hf buckets sync hf://buckets/aws-neuron/torch-neuronx-neff-cache/neuronxcc-{CC}"
        f" /tmp/neff_cache/neuronxcc-{CC}"
    )
    assert page.find_element(By.ID, "run").text.startswith("NEURON_RT_VISIBLE_CORES=0-3 ")
    assert "load_s 50.0 s · compile_s 300 s · generate_s 10.0 s · other 40.0 s" in detail.text  # the split
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "viewer.png"
    assert page.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")
    page.find_element(By.ID, "detail-close").click()
    assert wait_for(lambda: not detail.is_displayed())


def test_hub_unavailable_is_shown_in_the_page(browser: Any, dataset: Path, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    done = cli("report", "--results-dir", str(dataset / "results"), "--out", str(tmp_path / "s"), "--no-hub")
    assert done.returncode == 0, done.stderr
    browser.get((tmp_path / "s" / "index.html").as_uri())
    assert wait_for(lambda: browser.execute_script("return document.body.dataset.ready") == "true")
    browser.find_element(By.ID, "view-trending").click()
    notice = wait_for(lambda: browser.find_elements(By.ID, "hub-unavailable"))
    assert notice[0].text == "Hub rankings unavailable: not fetched (--no-hub)"
    assert table(browser) == {}


def failing_rows() -> list[Row]:
    """One stack where one unsupported op blocks two models, a hostile error blocks a third, one passes."""

    def failed(model: str, error: str, task: str = "text-generation") -> Row:
        return make_row(model, "ERROR", NEW, failure_stage="compile", error=error, task=task)

    op = (
        "BackendCompilerFailed: backend='neuron' raised:\nNotImplementedError: Could not run 'aten::_fancy_op' with "
        "arguments from the 'Neuron' backend: input {shape} at {address}\n\nSet TORCHDYNAMO_VERBOSE=1 for the "
        "internal stack trace"
    )
    return [
        failed("org/alpha-1b", op.format(shape="[2, 37, 64]", address="0x7f3a2c001b40")),
        failed("org/gamma-vl", op.format(shape="[1, 9, 128]", address="0x55d0c0ffee00"), task="image-text-to-text"),
        failed("org/beta-7b", f"RuntimeError: {XSS}"),
        make_row("org/never-run", "PASS", NEW),
    ]


def test_failures_view_shows_the_table_the_cli_prints(browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    write_rows(tmp_path / "results", failing_rows())
    printed = cli("failures", "--results-dir", str(tmp_path / "results"))
    assert printed.returncode == 0, printed.stderr
    counts = dict((m.group(2), int(m.group(1))) for m in re.finditer(r"^(\d+) model\(s\)  (.+)$", printed.stdout, re.M))
    assert sorted(counts.values()) == [1, 2]
    done = cli("report", "--results-dir", str(tmp_path / "results"), "--out", str(tmp_path / "s"), "--no-hub")
    assert done.returncode == 0, done.stderr
    browser.get((tmp_path / "s" / "index.html").as_uri())
    assert wait_for(lambda: browser.execute_script("return document.body.dataset.ready") == "true")
    assert not browser.find_element(By.ID, "failures-view").is_displayed()
    browser.find_element(By.ID, "view-failures").click()
    assert wait_for(lambda: browser.find_element(By.ID, "failures-view").is_displayed())
    assert not browser.find_element(By.ID, "models").is_displayed()  # the models table gives way to it

    def shown() -> list[tuple[str, int, list[str]]]:
        rows = browser.find_elements(By.CSS_SELECTOR, "#failures tbody tr")
        return [
            (
                tr.get_attribute("data-signature"),
                int(tr.get_attribute("data-count")),
                [b.text for b in tr.find_elements(By.CSS_SELECTOR, "button.model")],
            )
            for tr in rows
        ]

    table_now = shown()
    # The same signatures, counts and order as `neuron-support failures` printed.
    assert [(sig, n) for sig, n, _ in table_now] == list(counts.items())
    op_sig, _, models = table_now[0]
    assert models == ["org/alpha-1b", "org/gamma-vl"] and "aten::_fancy_op" in op_sig
    cells = browser.find_elements(By.CSS_SELECTOR, "#failures tbody tr")[0].find_elements(By.TAG_NAME, "td")
    assert [c.text for c in cells[:2]] == ["2", op_sig]
    assert cells[3].text.startswith("org/alpha-1b: BackendCompilerFailed: backend='neuron' raised: NotImplementedError")
    assert "2 failure signature(s) block 3 model(s)" in browser.find_element(By.ID, "failures-info").text
    # A hostile error is text here too.
    assert browser.execute_script("return window.__xss === undefined")
    assert browser.find_elements(By.CSS_SELECTOR, "#failures img") == []
    # The task filter and the search narrow the models inside each signature.
    browser.find_element(By.ID, "search").send_keys("gamma")
    assert wait_for(lambda: [(n, m) for _, n, m in shown()] == [(1, ["org/gamma-vl"])])
    browser.find_element(By.ID, "search").clear()
    browser.find_element(By.ID, "search").send_keys("nothing-fails-here")
    assert wait_for(lambda: shown() == [])
    assert "nothing blocks a model here" in browser.find_element(By.ID, "failures-info").text
    browser.find_element(By.ID, "search").clear()
    browser.find_element(By.ID, "search").send_keys("a")
    assert wait_for(lambda: len(shown()) == 2)
    # A model opens its row, whose detail shows the signature beside the error.
    browser.find_element(By.CSS_SELECTOR, "#failures button.model[data-model='org/gamma-vl']").click()
    assert wait_for(browser.find_element(By.ID, "detail").is_displayed)
    assert browser.find_element(By.CSS_SELECTOR, "#detail dd[data-column='signature']").text == op_sig
    browser.find_element(By.ID, "detail-close").click()
    browser.find_element(By.ID, "view-selected").click()
    assert wait_for(lambda: browser.find_element(By.ID, "models").is_displayed())
    assert not browser.find_element(By.ID, "failures-view").is_displayed()


def test_ci_installs_chromium_and_runs_the_tests_requiring_it() -> None:
    # The browser tests above must not be skipped in CI by accident: .ci/run installs the browser
    # and runs README's test command with the variable that makes a missing browser a failure.
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "apt-get install -y --no-install-recommends chromium chromium-driver" in ci
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    command = "pytest tests -n 2"
    assert f"&& {command}\n" in readme, "README's test command changed: update .ci/run and this test"
    assert f"&& {REQUIRE_BROWSER}=1 {command}\n" in ci


def test_a_missing_browser_fails_the_browser_tests_when_required(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fixture itself, in a session of its own (a subprocess, so this module stays untouched)
    # whose browser path points nowhere: skipped by default, failed with the variable set.
    pytester.makeconftest("")
    pytester.makepyfile(
        test_browser=f"""
        import sys
        from pathlib import Path
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import test_viewer
        test_viewer.CHROMIUM = Path("/nonexistent/chromium")
        from test_viewer import browser  # noqa: F401

        def test_uses_it(browser):
            pass
        """
    )
    # The model-checking plugin is not what is tested, and would want a catalog here.
    args = ("-p", "no:cacheprovider", "-p", "no:neuron_support")
    monkeypatch.delenv(REQUIRE_BROWSER, raising=False)
    pytester.runpytest_subprocess(*args).assert_outcomes(skipped=1)
    monkeypatch.setenv(REQUIRE_BROWSER, "1")
    failed = pytester.runpytest_subprocess(*args)
    failed.assert_outcomes(errors=1)
    failed.stdout.fnmatch_lines([f"*{REQUIRE_BROWSER}=1 requires them*"])


def test_the_check_filter_tells_a_models_training_row_from_its_inference_row(browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    losses = {"train_losses": (8.1, 11.2, 6.4), "cpu_train_losses": (8.1, 11.2, 6.3)}
    write_rows(
        tmp_path / "results",
        [
            make_row("org/alpha-1b", "PASS", NEW),
            make_row(
                "org/alpha-1b", "FAIL", NEW, check="train", failure_stage="train", train_first_bad_step=2, **losses
            ),
        ],
    )
    catalog = tmp_path / "models.yaml"
    catalog.write_text("models:\n  - {id: org/alpha-1b, task: text-generation, checks: [inference, train]}\n")
    report = ("report", "--results-dir", str(tmp_path / "results"), "--models-file", str(catalog))
    done = cli(*report, "--out", str(tmp_path / "s"), "--no-hub")
    assert done.returncode == 0, done.stderr
    browser.get((tmp_path / "s" / "index.html").as_uri())
    assert wait_for(lambda: browser.execute_script("return document.body.dataset.ready") == "true")

    def checks() -> list[str]:
        rows = browser.find_elements(By.CSS_SELECTOR, "#models tbody tr")
        return sorted(tr.get_attribute("data-check") for tr in rows)

    assert wait_for(lambda: checks() == ["inference", "train"])  # both rows, side by side
    Select(browser.find_element(By.ID, "check")).select_by_value("train")
    assert wait_for(lambda: table(browser) == {"org/alpha-1b": "FAIL"})
    Select(browser.find_element(By.ID, "check")).select_by_value("inference")
    assert wait_for(lambda: table(browser) == {"org/alpha-1b": "PASS"})


def test_a_text_to_image_row_shows_the_device_and_cpu_images_side_by_side(browser: Any, tmp_path: Path) -> None:
    # Real PNGs where a text-to-image row names them; the report embeds them in the one page, which shows
    # them in the row's details (checked decoded by the browser itself).
    from PIL import Image
    from selenium.webdriver.common.by import By

    results = tmp_path / "results"
    runs = results / "runs" / "org--sd" / "cpu"
    colours = {"device": (200, 30, 30), "reference": (30, 30, 200)}
    for folder, colour in colours.items():
        (runs / folder).mkdir(parents=True)
        Image.new("RGB", (8, 8), colour).save(runs / folder / "image.png")
    row = Row(
        model_id="org/sd",
        result="PASS",
        task="text-to-image",
        device="cpu",
        verdict_basis="pipeline-teacher-forced",
        image="runs/org--sd/cpu/device/image.png",
        reference_image="runs/org--sd/cpu/reference/image.png",
        image_psnr=31.5,
    )
    gone = Row(model_id="org/gone", result="PASS", task="text-to-image", device="cpu", image="runs/nowhere.png")
    write_rows(results, [row, gone])
    site = tmp_path / "site"
    done = cli("report", "--results-dir", str(results), "--out", str(site), "--no-hub")
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in site.iterdir()) == ["README.md", "index.html"]  # still one page
    browser.get((site / "index.html").as_uri())
    assert wait_for(lambda: browser.execute_script("return document.body.dataset.ready") == "true")
    browser.find_element(By.CSS_SELECTOR, "button.model[data-model='org/sd']").click()
    images = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#detail figure.image img"))
    assert [img.get_attribute("alt") for img in images] == ["device (cpu)", "CPU reference"]
    assert wait_for(lambda: all(browser.execute_script("return arguments[0].naturalWidth", i) == 8 for i in images))
    # Each shows its own file: the device's red, the reference's blue (the browser's own decoding).
    red = browser.execute_script(
        "const c = document.createElement('canvas'); c.width = c.height = 1; const x = c.getContext('2d');"
        "x.drawImage(arguments[0], 0, 0, 1, 1); return Array.from(x.getImageData(0, 0, 1, 1).data.slice(0, 3));",
        images[0],
    )
    assert red == list(colours["device"])
    assert "Images: device and CPU (PSNR 31.5 dB)" in browser.find_element(By.ID, "detail").text
    # A row whose image is gone shows none, and the page says so instead of a broken picture.
    browser.find_element(By.ID, "detail-close").click()
    browser.find_element(By.CSS_SELECTOR, "button.model[data-model='org/gone']").click()
    assert wait_for(lambda: "org/gone" in browser.find_element(By.ID, "detail").text)
    assert browser.find_elements(By.CSS_SELECTOR, "#detail figure.image img") == []


def census_rows() -> list[Row]:
    """A census on one stack (source census): one architecture compiles to one graph, one recompiles past the
    limit, one breaks the graph and its teacher-forced check disagrees; and a Selected model's row."""

    def census(arch: str, result: str, **kwargs: Any) -> Row:
        return make_row(f"census/{arch}", result, NEW, source="census", device="cpu", **kwargs)

    return [
        census(
            "llama",
            "PASS",
            graphs_compiled=1,
            graph_breaks=0,
            recompiles=0,
            positions_checked=16,
            positions_disagreeing=0,
            verdict_basis="parity+teacher-forced",
        ),
        census(
            "gemma3_text",
            "PASS",
            graphs_compiled=9,
            excess_graphs=8,
            graph_breaks=0,
            recompiles=8,
            recompile_limit="cache_size_limit reached",
            positions_checked=16,
            positions_disagreeing=0,
        ),
        census(
            "mamba",
            "FAIL",
            failure_stage="parity",
            graphs_compiled=3,
            excess_graphs=2,
            graph_breaks=2,
            graph_break_reasons=("Unsupported: call_function torch._C._nn.scan",),
            recompiles=0,
            positions_checked=16,
            positions_disagreeing=4,
            error=f"parity: {XSS}",
        ),
        # A forward task's census row: its own org, its forward graph, no teacher-forced check.
        make_row(
            "census-fill-mask/bert",
            "PASS",
            NEW,
            task="fill-mask",
            source="census",
            device="cpu",
            graphs_compiled=1,
            graph_breaks=0,
            recompiles=0,
            # Its decisions: 8 checked, 1 differing in a near-tie (not a teacher-forced check's positions).
            positions_checked=8,
            positions_disagreeing=1,
            verdict_basis="forward-calibrated",
        ),
        make_row("org/alpha-1b", "ERROR", NEW, failure_stage="compile", error="RuntimeError: boom"),
    ]


def test_architectures_view_shows_the_census_and_keeps_it_out_of_selected_and_failures(
    browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    write_rows(tmp_path / "results", census_rows())
    done = cli("report", "--results-dir", str(tmp_path / "results"), "--out", str(tmp_path / "s"), "--no-hub")
    assert done.returncode == 0, done.stderr
    browser.get((tmp_path / "s" / "index.html").as_uri())
    assert wait_for(lambda: browser.execute_script("return document.body.dataset.ready") == "true")
    # Selected lists the model checked (beside the catalog's), not the census's tiny random models.
    selected = table(browser)
    assert selected["org/alpha-1b"] == "ERROR" and not [m for m in selected if m.startswith("census")]
    browser.find_element(By.ID, "view-census").click()
    assert wait_for(lambda: browser.find_element(By.ID, "census-view").is_displayed())
    assert not browser.find_element(By.ID, "models").is_displayed()

    def shown() -> dict[str, tuple[str | None, str | None, list[str]]]:
        return {
            tr.get_attribute("data-architecture"): (
                tr.get_attribute("data-result"),
                tr.get_attribute("data-one-graph"),
                [td.text for td in tr.find_elements(By.TAG_NAME, "td")],
            )
            for tr in browser.find_elements(By.CSS_SELECTOR, "#census tbody tr")
        }

    rows = wait_for(shown)
    assert sorted(rows) == ["bert", "gemma3_text", "llama", "mamba"]
    assert rows["llama"][:2] == ("PASS", "true") and rows["llama"][2][1] == "text-generation"
    assert rows["llama"][2][3:8] == ["1", "0", "0", "", "agrees (16)"]
    assert rows["gemma3_text"][:2] == ("PASS", "false") and rows["gemma3_text"][2][6] == "cache_size_limit reached"
    assert "(recompile limit: eager)" in rows["gemma3_text"][2][2]
    assert rows["mamba"][:2] == ("FAIL", "false") and rows["mamba"][2][7] == "4 of 16 disagree"
    # A forward task's architecture: its task, its one forward graph, no teacher-forced check, its basis.
    assert rows["bert"][:2] == ("PASS", "true")
    assert rows["bert"][2][1] == "fill-mask" and rows["bert"][2][7:] == ["", "forward-calibrated"]
    info = browser.find_element(By.ID, "census-info").text
    assert "4 architecture(s) of 2 task(s) on " in info
    assert "2 compile to exactly one graph, 1 break the graph, 1 hit the recompile limit" in info
    assert "By task: fill-mask 1 (1 one graph), text-generation 3 (1 one graph)." in info
    breaks = browser.find_element(By.CSS_SELECTOR, "#census tr[data-architecture='mamba'] td:nth-child(5)")
    assert breaks.get_attribute("title") == "Unsupported: call_function torch._C._nn.scan"
    # The search narrows by architecture; an architecture opens its row's detail; hostile text stays text.
    browser.find_element(By.ID, "search").send_keys("gemma")
    assert wait_for(lambda: sorted(shown()) == ["gemma3_text"])
    browser.find_element(By.ID, "search").clear()
    browser.find_element(By.ID, "search").send_keys("mamba")
    assert wait_for(lambda: sorted(shown()) == ["mamba"])
    browser.find_element(By.ID, "search").clear()
    browser.find_element(By.ID, "search").send_keys("fill-mask")  # by task too
    assert wait_for(lambda: sorted(shown()) == ["bert"])
    browser.find_element(By.ID, "search").clear()
    browser.find_element(By.ID, "search").send_keys("mamba")
    assert wait_for(lambda: sorted(shown()) == ["mamba"])
    browser.find_element(By.CSS_SELECTOR, "#census button.model[data-model='census/mamba']").click()
    assert wait_for(browser.find_element(By.ID, "detail").is_displayed)
    assert browser.execute_script("return window.__xss === undefined")
    browser.find_element(By.ID, "detail-close").click()
    # The Failures view counts the Selected model's failure, not the census's.
    browser.find_element(By.ID, "search").clear()
    browser.find_element(By.ID, "search").send_keys("a")  # clear() fires no input event: the search stays
    browser.find_element(By.ID, "view-failures").click()
    models = wait_for(lambda: [b.text for b in browser.find_elements(By.CSS_SELECTOR, "#failures button.model")])
    assert models == ["org/alpha-1b"]


# --- links, near ties, what a row produced and how to install it (issue 39, item 8) ---------------


def ready(driver: Any, url: str) -> None:
    """Open ``url`` as a fresh page load (a blank page first: a fragment change alone would not reload)."""
    driver.get("about:blank")
    driver.get(url)
    assert wait_for(lambda: driver.execute_script("return document.body.dataset.ready") == "true")


def fragment(driver: Any) -> str:
    return str(driver.execute_script("return decodeURIComponent(location.hash)"))


def test_a_fragment_opens_its_view_or_row_and_navigating_writes_it(browser: Any, site: Path) -> None:
    from selenium.webdriver.common.by import By

    def selected_view() -> str:
        return str(browser.find_element(By.CSS_SELECTOR, "nav button[aria-selected='true']").get_attribute("data-view"))

    def detail() -> tuple[str, str] | None:
        panel = browser.find_element(By.ID, "detail")
        if not panel.is_displayed():
            return None
        return panel.find_element(By.TAG_NAME, "h2").text, panel.find_element(By.CSS_SELECTOR, ".badge").text

    uri = (site / "index.html").as_uri()
    ready(browser, uri + "#view=downloads")
    assert selected_view() == "downloads"
    assert next(iter(table(browser))) == "hub/fresh-model"  # the Downloads ranking, most downloads first
    ready(browser, uri + "#view=census")
    assert browser.find_element(By.ID, "census-view").is_displayed()
    # A row opens on its own stack (the older one here: the selectors follow), with the view behind it.
    old_stack = f"neuronxcc-{CC}__transformers-{OLD}"
    ready(browser, uri + f"#view=selected&row=org/beta-7b/inference&stack={old_stack}")
    assert detail() == ("org/beta-7b", "ERROR")
    assert browser.find_element(By.ID, "library").get_attribute("value") == f"transformers {OLD}"
    assert table(browser)["org/gamma-vl"] == "FAIL"  # the table behind shows the same stack
    # Without a stack, the newest stack's row; the model's id keeps its slash.
    ready(browser, uri + "#row=org/alpha-1b/inference")
    assert detail() == ("org/alpha-1b", "TIMEOUT") and selected_view() == "selected"
    # A model a view lists untested opens too; a row this report does not hold says so.
    ready(browser, uri + "#view=trending&row=hub/fresh-model")
    assert detail() == ("hub/fresh-model", "not tested") and selected_view() == "trending"
    ready(browser, uri + "#row=org/nowhere/inference")
    assert "No row org/nowhere/inference in this report" in browser.find_element(By.ID, "row-missing").text

    # Navigating writes the fragment: a view, a filter, a row; its link is that address; back undoes.
    ready(browser, uri)
    assert fragment(browser) == ""
    browser.find_element(By.ID, "view-trending").click()
    assert wait_for(lambda: fragment(browser) == "#view=trending")
    browser.find_element(By.ID, "search").send_keys("alpha")
    assert wait_for(lambda: fragment(browser) == "#view=trending&q=alpha")
    browser.find_element(By.CSS_SELECTOR, "button.model[data-model='org/alpha-1b']").click()
    new_stack = f"neuronxcc-{CC}__transformers-{NEW}"
    row_fragment = f"#view=trending&q=alpha&row=org/alpha-1b/inference&stack={new_stack}"
    assert wait_for(lambda: fragment(browser) == row_fragment)
    link = browser.find_element(By.ID, "row-link").get_attribute("href")
    assert link.split("#", 1)[1] == browser.execute_script("return location.hash").lstrip("#")
    browser.back()
    assert wait_for(lambda: detail() is None)
    assert fragment(browser) == "#view=trending&q=alpha"
    browser.forward()
    assert wait_for(lambda: detail() == ("org/alpha-1b", "TIMEOUT"))
    # The address reopens the same page in a fresh load.
    address = browser.current_url
    ready(browser, address)
    assert detail() == ("org/alpha-1b", "TIMEOUT") and selected_view() == "trending"
    assert browser.find_element(By.ID, "search").get_attribute("value") == "alpha"
    browser.find_element(By.ID, "detail-close").click()
    assert wait_for(lambda: fragment(browser) == "#view=trending&q=alpha")
    assert [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"] == []


def near_tie_rows() -> list[Row]:
    """PASSes exact and near-tie (free-running and teacher-forced), a near-tie FAIL, a census near-tie."""
    return [
        make_row(
            "org/exact",
            "PASS",
            NEW,
            parity_mode="exact",
            reference_match=True,
            verdict_basis="parity+teacher-forced",
        ),
        make_row(
            "org/tie-free",
            "PASS",
            NEW,
            parity_mode="near-tie",
            reference_match=False,
            first_divergence=4,
            logprob_gap=0.031,
            near_tie=True,
            verdict_basis="parity+teacher-forced",
        ),
        make_row(
            "org/tie-forced",
            "PASS",
            NEW,
            parity_mode="near-tie",
            reference_match=True,
            positions_checked=32,
            positions_disagreeing=2,
            disagreements_near_tie=True,
            max_logprob_deficit=0.12,
        ),
        make_row(
            "org/tie-fail",
            "FAIL",
            NEW,
            failure_stage="parity",
            parity_mode="exact",
            reference_match=False,
            first_divergence=3,
            near_tie=True,
        ),
        make_row("census/llama", "PASS", NEW, source="census", device="cpu", parity_mode="near-tie", near_tie=True),
    ]


def test_a_near_tie_pass_is_marked_in_the_table_the_census_and_its_page(browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    write_rows(tmp_path / "results", near_tie_rows())
    catalog = tmp_path / "models.yaml"  # one entry: the others show as models checked with --model
    catalog.write_text("models:\n  - {id: org/exact, task: text-generation}\n", encoding="utf-8")
    report = ("report", "--results-dir", str(tmp_path / "results"), "--models-file", str(catalog))
    done = cli(*report, "--out", str(tmp_path / "s"), "--no-hub")
    assert done.returncode == 0, done.stderr
    ready(browser, (tmp_path / "s" / "index.html").as_uri())
    marked = {
        tr.get_attribute("data-model"): tr.get_attribute("data-near-tie")
        for tr in browser.find_elements(By.CSS_SELECTOR, "#models tbody tr")
    }
    assert marked == {"org/exact": "false", "org/tie-free": "true", "org/tie-forced": "true", "org/tie-fail": "false"}
    label = browser.find_element(By.CSS_SELECTOR, "tr[data-model='org/tie-free'] .badge.near-tie")
    assert label.is_displayed() and label.text == "near-tie"
    assert label.get_attribute("title") == (
        "PASS with --parity=near-tie: free-running tokens part from the CPU's at index 4, gap 0.031 nats, a near-tie"
    )
    forced = browser.find_element(By.CSS_SELECTOR, "tr[data-model='org/tie-forced'] .badge.near-tie")
    assert "2 of 32 teacher-forced positions disagree, all near-ties, max deficit 0.12 nats" in forced.get_attribute(
        "title"
    )
    # Only PASSes carry it: a FAIL whose miss was a near-tie is a FAIL, an exact PASS is unmarked.
    for model in ("org/exact", "org/tie-fail"):
        assert browser.find_elements(By.CSS_SELECTOR, f"tr[data-model='{model}'] .badge.near-tie") == []
    # The parity mode is a column of the table.
    heads = [th.get_attribute("data-column") for th in browser.find_elements(By.CSS_SELECTOR, "#models thead th")]
    column = heads.index("parity_mode") + 1
    mode = {
        m: browser.find_element(By.CSS_SELECTOR, f"tr[data-model='{m}'] td:nth-child({column})").text
        for m in ("org/exact", "org/tie-free")
    }
    assert mode == {"org/exact": "exact", "org/tie-free": "near-tie"}
    assert browser.find_element(By.CSS_SELECTOR, "#summary .chip[data-result='PASS']").text == "PASS 3 (2 near-tie)"
    # The row's page: the label by the result, the reason, and the mode among the result's fields.
    browser.find_element(By.CSS_SELECTOR, "button.model[data-model='org/tie-free']").click()
    assert wait_for(browser.find_element(By.ID, "detail").is_displayed)
    assert browser.find_element(By.CSS_SELECTOR, "#detail .badge.near-tie").is_displayed()
    assert "a near-tie" in browser.find_element(By.CSS_SELECTOR, "#detail .near-tie-note").text
    assert browser.find_element(By.CSS_SELECTOR, "#detail dd[data-column='parity_mode']").text == "near-tie"
    # The Architectures view marks it too.
    browser.find_element(By.ID, "view-census").click()
    census = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#census tr[data-architecture='llama']"))
    assert census[0].find_element(By.CSS_SELECTOR, ".badge.near-tie").text == "near-tie"


def output_rows() -> list[Row]:
    """A text-to-image FAIL and PASS with the libraries their run.py imported and the numeric check's
    evidence, a generated text and a transcript, and a row from before the libraries column."""
    image: dict[str, Any] = {"task": "text-to-image", "device": "cpu"}
    libraries = (f"transformers=={NEW}", "diffusers==0.42.1")
    stages = ("denoise[0]", "guidance[0]", "scheduler[0]", "denoise[1]", "scheduler[1]")
    return [
        make_row(
            "org/sd-broken",
            "FAIL",
            NEW,
            failure_stage="parity",
            libraries=libraries,
            numeric_stages=stages,
            numeric_ratios=(0.41, 0.2, 0.33, 0.52, 12.4),
            evidence_stage="scheduler",
            evidence_step=1,
            evidence_distance=0.0123,
            noise_floor=0.000992,
            noise_ratio=12.4,
            **image,
        ),
        make_row(
            "org/sd",
            "PASS",
            NEW,
            libraries=libraries,
            numeric_stages=stages,
            numeric_ratios=(0.41, 0.2, 0.33, 0.812, 0.5),
            evidence_stage="denoise",
            evidence_step=1,
            evidence_distance=0.00081,
            noise_floor=0.000998,
            noise_ratio=0.812,
            **image,
        ),
        make_row(
            "org/llm",
            "PASS",
            NEW,
            prompt="The capital of France is",
            text=" Paris. The capital of Germany is Berlin.",
            libraries=(f"transformers=={NEW}",),
        ),
        make_row("org/whisper", "PASS", NEW, task="automatic-speech-recognition", text=" Hello from the device."),
    ]


def test_a_rows_page_shows_what_it_produced_above_run_py_and_every_library_to_install(
    browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    results = tmp_path / "results"
    write_rows(results, output_rows())
    done = cli("report", "--results-dir", str(results), "--out", str(tmp_path / "s"), "--no-hub")
    assert done.returncode == 0, done.stderr
    uri = (tmp_path / "s" / "index.html").as_uri()

    def open_row(model: str) -> Any:
        ready(browser, f"{uri}#row={model}/inference")
        panel = browser.find_element(By.ID, "detail")
        assert panel.is_displayed()
        return panel

    # The table says how close each numeric check came: a FAIL's stage, step and ratio, a PASS's closest.
    ready(browser, uri)
    heads = [th.get_attribute("data-column") for th in browser.find_elements(By.CSS_SELECTOR, "#models thead th")]
    assert "noise_ratio" in heads and not [h for h in heads if h.startswith("denoise_")]
    column = heads.index("noise_ratio") + 1

    def ratio(model: str) -> str:
        return str(browser.find_element(By.CSS_SELECTOR, f"tr[data-model='{model}'] td:nth-child({column})").text)

    times = "\N{MULTIPLICATION SIGN}"
    assert ratio("org/sd-broken") == f"12.4{times} scheduler[1]" and ratio("org/sd") == f"0.812{times} denoise[1]"
    assert ratio("org/llm") == ""
    # The text-to-image row's packages box names diffusers, at the version that ran.
    panel = open_row("org/sd-broken")
    install = browser.find_element(By.ID, "install").text
    assert f"pip install torch==2.9.0 transformers=={NEW} diffusers==0.42.1" in install, install
    evidence = browser.find_element(By.ID, "numeric-evidence").text
    assert evidence == "out of tolerance first at scheduler[1]: distance 0.0123 = 12.4 x the noise floor 0.000992"
    shown = {dd.get_attribute("data-column") for dd in panel.find_elements(By.CSS_SELECTOR, "dl dd[data-column]")}
    assert {"evidence_stage", "evidence_step", "noise_floor", "noise_ratio", "numeric_stages", "libraries"} <= shown
    open_row("org/sd")
    assert browser.find_element(By.ID, "numeric-evidence").text.startswith("closest to its tolerance at denoise[1]:")
    # A generated text and a transcript head the page, above a collapsed run.py.
    open_row("org/llm")
    text = browser.find_element(By.ID, "output-text")
    assert text.get_attribute("textContent") == " Paris. The capital of Germany is Berlin." and text.is_displayed()
    assert browser.find_element(By.ID, "output-prompt").text == "The capital of France is"
    box = browser.find_element(By.ID, "runscript-box")
    assert box.get_attribute("open") is None
    above = browser.execute_script("return !!(arguments[0].compareDocumentPosition(arguments[1]) & 4)", text, box)
    assert above, "the generated text must come before run.py"
    panel = open_row("org/whisper")
    assert "Transcript (device)" in panel.text
    assert browser.find_element(By.ID, "output-text").get_attribute("textContent") == " Hello from the device."
    # A row from before the libraries column: its one library, as before.
    assert browser.find_element(By.ID, "install").text.endswith(f"pip install torch==2.9.0 transformers=={NEW}")
    # `runscript` prints the same packages (one function makes both).
    printed = cli("runscript", "org/sd-broken", "--results-dir", str(results))
    assert printed.returncode == 0, printed.stderr
    assert f"pip install torch==2.9.0 transformers=={NEW} diffusers==0.42.1\n" in printed.stdout


def test_a_large_image_is_embedded_as_a_thumbnail_and_a_small_one_as_it_is(tmp_path: Path) -> None:
    # Catalog pipelines make their default resolution (1024² for SDXL): the page embeds two images a row,
    # so a large one goes in scaled down, the full image staying in the run folder.
    import base64
    import io

    from PIL import Image

    from pytest_neuron_support.viewer.report import THUMBNAIL_PX, embedded_images

    for name, size in (("large.png", (1024, 768)), ("small.png", (64, 64))):
        Image.new("RGB", size, (200, 30, 30)).save(tmp_path / name)
    rows = [make_row("org/sdxl", "PASS", "0.42.1", image="large.png", reference_image="small.png")]
    found = embedded_images(rows, tmp_path)[0]
    large = Image.open(io.BytesIO(base64.b64decode(found["image_src"].split(",", 1)[1])))
    assert large.size == (THUMBNAIL_PX, THUMBNAIL_PX * 3 // 4)
    small = base64.b64decode(found["reference_image_src"].split(",", 1)[1])
    assert small == (tmp_path / "small.png").read_bytes()


def test_a_rows_page_tells_its_whole_story_and_carries_its_reproducer(browser: Any, tmp_path: Path) -> None:
    """The row's page shows what `neuron-support explain` prints (the first diverging module of a numerics FAIL
    included) and a compile ERROR's standalone reproducer, read from the run folder beside the dataset."""
    from selenium.webdriver.common.by import By

    results = tmp_path / "results"
    script = results / "runs" / "org--beta-7b" / "neuron" / "compile-repro" / "repro.py"
    script.parent.mkdir(parents=True)
    script.write_text("# the graph the backend failed on\nraise SystemExit('NCC_IBIR227')\n")
    replay = results / "runs" / "org--alpha-1b" / "neuron" / "fallback-repro" / "run.py"
    replay.parent.mkdir(parents=True)
    replay.write_text("# each call of the ops that fell back, alone\n")
    located = {
        "diverging_module": "model.layers.3.self_attn.o_proj",
        "diverging_module_kind": "Linear",
        "diverging_distance": 0.41,
        "diverging_ratio": 96.0,
        "last_inside_module": "model.layers.3.self_attn.v_proj",
        "locate_note": "located: 40 module outputs compared",
    }
    compile_error = "BackendCompilerFailed: backend='neuron' raised: CompilationError: NCC_IBIR227 on the decode loop"
    write_rows(
        results,
        [
            make_row(
                "org/alpha-1b",
                "FAIL",
                NEW,
                failure_stage="parity",
                error="tokens differ",
                fallback_ops=("aten::cumsum",),
                fallback_calls=("aten::cumsum(bfloat16[1, 7], -1) x3",),
                fallback_reproducer="runs/org--alpha-1b/neuron/fallback-repro/run.py",
                fallback_note="recorded on an eager rerun (4.0 s): 1 distinct call(s) of aten::cumsum",
                **located,
            ),
            make_row(
                "org/beta-7b",
                "ERROR",
                NEW,
                failure_stage="compile",
                error=compile_error,
                compiler_error_code="NCC_IBIR227",
                reproducer="runs/org--beta-7b/neuron/compile-repro/repro.py",
                reproducer_note="captured by Dynamo's repro_after='dynamo' on a rerun",
            ),
        ],
    )
    done = cli("report", "--results-dir", str(results), "--out", str(tmp_path / "s"), "--no-hub")
    assert done.returncode == 0, done.stderr
    uri = (tmp_path / "s" / "index.html").as_uri()

    ready(browser, uri + "#row=org/alpha-1b/inference")
    story = browser.find_element(By.ID, "story").get_attribute("textContent")
    assert "5. first diverging module\n   model.layers.3.self_attn.o_proj (Linear): relative distance" in story, story
    assert "the last module inside was model.layers.3.self_attn.v_proj" in story
    assert browser.find_elements(By.ID, "reproducer-box") == []  # a FAIL has no compile reproducer
    # The ops it ran on the host: their calls with dtypes and shapes, and the script that makes each alone.
    assert "fallback_calls: aten::cumsum(bfloat16[1, 7], -1) x3" in story
    fallback = browser.find_element(By.ID, "fallback-box")
    assert "runs/org--alpha-1b/neuron/fallback-repro/run.py" in fallback.find_element(By.TAG_NAME, "summary").text
    assert browser.find_element(By.ID, "fallback-reproducer").get_attribute("textContent") == replay.read_text()

    ready(browser, uri + "#row=org/beta-7b/inference")
    box = browser.find_element(By.ID, "reproducer-box")
    assert "runs/org--beta-7b/neuron/compile-repro/repro.py" in box.find_element(By.TAG_NAME, "summary").text
    assert browser.find_element(By.ID, "reproducer").get_attribute("textContent") == script.read_text()
    story = browser.find_element(By.ID, "story").get_attribute("textContent")
    assert "the compiler's error code: NCC_IBIR227" in story and "--reproducer > repro.py" in story
    assert browser.find_elements(By.ID, "fallback-box") == []  # nothing of it ran on the host
