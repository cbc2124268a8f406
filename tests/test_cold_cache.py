"""The ``cold_inductor_cache`` fixture (tests/conftest.py) gives a test a compile that is really cold:
inductor's persistent cache is otherwise ``<tmp>/torchinductor_<user>``, shared with every earlier
test and CI run on the machine, where "cold" can be served warm."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import INDUCTOR_CACHE_ENV

# One small graph compiled with inductor in a fresh process (as run.py compiles in its own); prints the
# FX-graph cache's hits and misses and the cache directory inductor used.
COMPILE = """
import json, torch
from torch._dynamo.utils import counters
from torch._inductor.runtime.cache_dir_utils import cache_dir
f = torch.compile(lambda x: torch.sin(x) * 2 + 1, backend="inductor")
f(torch.ones(8))
print(json.dumps({"hits": counters["inductor"]["fxgraph_cache_hit"],
                  "misses": counters["inductor"]["fxgraph_cache_miss"], "dir": cache_dir()}))
"""


def compile_once(cwd: Path) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", COMPILE],
        capture_output=True,
        text=True,
        check=True,
        cwd=cwd,
        env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
        timeout=300,
    )
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_the_cold_cache_is_the_tests_own_and_empty_so_a_first_compile_misses(
    cold_inductor_cache: Path, tmp_path: Path
) -> None:
    assert os.environ[INDUCTOR_CACHE_ENV] == str(cold_inductor_cache) and not any(cold_inductor_cache.iterdir())
    first = compile_once(tmp_path)
    assert first["dir"] == str(cold_inductor_cache)  # the processes the test starts compile there
    assert (first["hits"], first["misses"]) == (0, 1), first
    assert any(cold_inductor_cache.rglob("*")), "inductor wrote nothing into the test's cache"
    # The same graph again, in another process: now warm, from that cache. A test that asserts a miss
    # would pass or fail on whatever ran before it, were the cache not its own.
    again = compile_once(tmp_path)
    assert (again["hits"], again["misses"]) == (1, 0), again
