"""``neuron-support doctor``: check, on this host, every assumption the harness makes about its device.

The neuron row of the device table is written from documentation and from a reading of torch-neuronx's
source (``shared/reference/torchneuron.md``); only a trn2 host can show whether it holds. Run this first
on a new host, a new Neuron SDK or a new runner image: it prints one row per assumption (check,
expected, found, status) and exits 1 when any fails, before a sweep spends hours on a broken premise.

Everything device-specific comes from the device table (:data:`~pytest_neuron_support.devices.DEVICES`):
a check that does not apply to a kind is decided by the table and reported as ``N/A`` with the field
that says so, never as a silent pass; a check whose prerequisite failed is ``NOT RUN``, with the
prerequisite named. Each check that touches the device runs in a short-lived subprocess of its own,
pinned to cores of this session's slice with the table's env applied, under a timeout: this process
never initialises the device (on neuron, a process that pins nothing reserves every core until it
exits). The checks' scripts and logs are kept in a work directory when anything fails.

This module imports neither torch nor transformers.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import json
import os
import platform
import pprint
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pytest_neuron_support.base.storage import write_atomic
from pytest_neuron_support.run.cores import parse_cores, parse_neuron_ls, session_cores
from pytest_neuron_support.run.devices import (
    AUTO_ORDER,
    DEVICES,
    NO_DEVICE_ENV,
    DeviceKind,
    ProbeResult,
    fallback_core_bytes,
    logical_nc_config,
    probe,
)
from pytest_neuron_support.run.runscript import template

OK = "OK"
FAIL = "FAIL"
NA = "N/A"
NOT_RUN = "NOT RUN"

#: Seconds each check may take (``--timeout``): a first neuronx-cc compile of a tiny graph takes tens of
#: seconds, the tiny generation compiles a decoding step.
DEFAULT_TIMEOUT_S = 600.0
#: How long the two processes of the concurrency check hold their cores once both are ready.
HOLD_S = 2.0
#: Relative tolerance of a bf16 result (torch.testing's default rtol for bfloat16).
BF16_RTOL = 1.6e-2
#: Tokens the tiny generation must produce (the random-weight checkpoint has no EOS, so it cannot stop early).
GENERATION_TOKENS = 4


@dataclass(frozen=True)
class CheckResult:
    """One row of the doctor's table.

    Attributes:
        number: position in the table (1-based, fixed order).
        key: short stable identifier (``memory``, ``process-group``...), for scripts reading the JSON.
        name: what is checked, as the table says it.
        expected: what the harness assumes, with the device table's fields it comes from.
        found: what this host showed: values, the error text of a failure, or, for ``N/A`` and
            ``NOT RUN``, the reason (the table field, or the prerequisite that did not pass).
        status: ``OK``, ``FAIL``, ``N/A`` (does not apply to this kind, by the table) or ``NOT RUN``
            (a prerequisite failed, so the check could not say anything).
        seconds: wall time the check took.
    """

    number: int
    key: str
    name: str
    expected: str
    found: str
    status: str
    seconds: float = 0.0


@dataclass(frozen=True)
class Report:
    """Everything one doctor run found.

    Attributes:
        device: the device kind checked (``auto`` resolved).
        checks: one result per check, in table order.
        versions: versions seen by the checks (torch, transformers, the device package, the compiler).
        timestamp: when the run ended (UTC, ISO 8601).
        work_dir: where the checks' scripts and logs were written (removed when every check passed).
    """

    device: str
    checks: tuple[CheckResult, ...]
    versions: Mapping[str, str]
    timestamp: str
    work_dir: str

    @property
    def passed(self) -> bool:
        """No check failed and none was left unrun (``N/A`` decided by the table is not a failure)."""
        return all(c.status in (OK, NA) for c in self.checks)

    def counts(self) -> dict[str, int]:
        return {status: sum(c.status == status for c in self.checks) for status in (OK, FAIL, NA, NOT_RUN)}

    def summary(self) -> str:
        counts = self.counts()
        text = f"doctor: {counts[OK]} OK, {counts[FAIL]} FAIL, {counts[NA]} N/A"
        if counts[NOT_RUN]:
            text += f", {counts[NOT_RUN]} NOT RUN"
        return f"{text} on {self.device}"

    def to_json(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "passed": self.passed,
            "timestamp": self.timestamp,
            "versions": dict(self.versions),
            "work_dir": self.work_dir,
            "summary": self.summary(),
            "checks": [dataclasses.asdict(c) for c in self.checks],
        }


# --------------------------------------------------------------------------------------------------
# The checks' scripts. Each is a small standalone program (standard library, torch, transformers):
# ARGS is written into it, it defines check() returning a JSON-able dict, and writes that (or the
# exception) to argv[1]. They stay in the work directory, so a failing one can be rerun by hand.

_PRELUDE = '''\
"""neuron-support doctor check: {name}. Rerun by hand with: python3 {file} out.json"""
import json
import os
import signal
import sys
import time
import traceback

ARGS = {args}


def _write(path, data):
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(data, handle)
    os.replace(path + ".tmp", path)


def synchronize(torch):
    # Device work is asynchronous: nothing is read before it is done.
    if ARGS.get("memory_module"):
        getattr(torch, ARGS["memory_module"]).synchronize()

'''

_EPILOGUE = """

if __name__ == "__main__":
    end_with_parent()  # a doctor killed outright must not leave a check holding device cores
    try:
        _result = check()
    except BaseException as exc:
        _result = {"error": f"{type(exc).__name__}: {exc}"[:4000], "traceback": traceback.format_exc()[-6000:]}
    _write(sys.argv[1], _result)
"""

_IMPORTS_SCRIPT = """
def check():
    from importlib import metadata

    import torch

    out = {"torch": torch.__version__, "python": sys.version.split()[0]}
    try:
        out["transformers"] = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        out["transformers"] = "none"
    module = ARGS["runtime_module"]
    if module:
        # Before importing the package ourselves: run.py never imports it, torch must have autoloaded it.
        out["autoloaded"] = module in sys.modules
        out["registered"] = bool(ARGS["memory_module"]) and hasattr(torch, ARGS["memory_module"])
        runtime = __import__(module)
        out["runtime_version"] = str(getattr(runtime, "__version__", "unknown"))
    return out
"""

_NO_AUTOLOAD_SCRIPT = """
def check():
    import torch  # noqa: F401

    autoload = os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD")
    return {"loaded": ARGS["runtime_module"] in sys.modules, "autoload": autoload}
"""

_EVAL_SCRIPT = """
def check():
    import torch

    value = eval(ARGS["expr"], {"torch": torch, "__import__": __import__})
    return {"value": repr(value)[:2000]}
"""

_MEMORY_SCRIPT = """
def check():
    import torch

    memory = getattr(torch, ARGS["memory_module"])
    x = torch.ones(1 << 18, dtype=torch.float32, device=ARGS["device"])  # 1 MiB
    memory.synchronize()
    return {
        "tensor_bytes": x.numel() * x.element_size(),
        "max_memory_allocated": int(memory.max_memory_allocated()),
        "memory_allocated": int(memory.memory_allocated()),
        "device": str(x.device),
        "pinned": os.environ.get(ARGS["core_env_var"] or "", None),
        # Read here, pinned to the core this check holds: on neuron it initialises the runtime, which
        # the unpinned device check (2) must not do.
        "core_memory": int(eval(ARGS["memory_expr"], {"torch": torch})) if ARGS.get("memory_expr") else None,
    }
"""

_BF16_SCRIPT = """
def check():
    import torch

    torch.manual_seed(0)
    a = torch.randn(64, 64).to(torch.bfloat16)
    b = torch.randn(64, 64).to(torch.bfloat16)
    cpu = (a @ b).float()
    on_device = a.to(ARGS["device"]) @ b.to(ARGS["device"])
    synchronize(torch)
    found = on_device.cpu().float()
    scale = float(cpu.abs().max())
    out = {
        "dtype": str(on_device.dtype),
        "device": str(on_device.device),
        "max_rel_diff": float((found - cpu).abs().max()) / scale,
    }
    module = ARGS.get("memory_module")
    if module and hasattr(getattr(torch, module), "is_bf16_supported"):
        out["is_bf16_supported"] = bool(getattr(torch, module).is_bf16_supported())
    return out
"""

_HOLD_SCRIPT = """
def check():
    import torch

    started = time.time()
    x = torch.ones(1 << 18, device=ARGS["device"]) * 2  # reserves the core: the runtime is up
    synchronize(torch)
    ready = time.time()
    if ARGS.get("ready_file"):
        open(ARGS["ready_file"], "w").close()
    partner = ARGS.get("wait_for")
    release = ARGS.get("release_file")
    deadline = time.time() + ARGS["wait_s"]
    # Hold until the partner holds its core too, then hold_s more: the two overlap by construction.
    while partner and not os.path.exists(partner) and time.time() < deadline:
        if release and os.path.exists(release):  # the partner failed: stop waiting for it
            break
        time.sleep(0.05)
    partner_ready = bool(partner) and os.path.exists(partner)
    end = time.time() + ARGS["hold_s"]
    while time.time() < end and not (release and os.path.exists(release)):
        time.sleep(0.05)
    total = float((x * 1).sum().cpu())
    return {
        "started": started,
        "ready": ready,
        "done": time.time(),
        "partner_ready": partner_ready,
        "device": str(x.device),
        "sum": total,
        "pinned": os.environ.get(ARGS["core_env_var"] or "", None),
    }
"""

_ALLOCATE_SCRIPT = """
def check():
    import torch

    x = torch.ones(1 << 10, device=ARGS["device"]) * 2
    synchronize(torch)
    return {"device": str(x.device), "sum": float(x.sum().cpu()), "pinned": os.environ.get(ARGS["core_env_var"] or "")}
"""

_COMPILE_SCRIPT = """
def f(x, y):
    return torch.sin(x) @ y + torch.relu(y) * 0.5


def check():
    global torch
    import torch
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    x = torch.randn(8, 8).to(ARGS["device"])
    y = torch.randn(8, 8).to(ARGS["device"])
    eager = f(x, y)
    synchronize(torch)
    counters.clear()
    compiled = torch.compile(f, backend=ARGS["backend"])
    out = compiled(x, y)
    synchronize(torch)
    expected = eager.cpu()
    return {
        "graphs": int(counters["stats"]["unique_graphs"]),
        "max_rel_diff": float((out.cpu() - expected).abs().max()) / float(expected.abs().max()),
        "device": str(out.device),
    }
"""

_CACHE_SCRIPT = """
def g(x):
    return torch.cos(x) * 3 + x


def counts(torch, counters):
    if ARGS["cache_stats_expr"]:
        # As run.py's cache_counts(): a wheel without the private stats binding leaves them unknown.
        try:
            stats = eval(ARGS["cache_stats_expr"], {"torch": torch, "__import__": __import__})
            return {"hits": int(stats["persistent_hits"]), "misses": int(stats["persistent_misses"])}
        except (AttributeError, ImportError, KeyError) as exc:
            return {"unavailable": f"{type(exc).__name__}: {exc}"[:300]}
    inductor = counters["inductor"]
    return {"hits": int(inductor["fxgraph_cache_hit"]), "misses": int(inductor["fxgraph_cache_miss"])}


def listing(root):
    found = []
    for parent, _, files in os.walk(root):
        found.extend(os.path.relpath(os.path.join(parent, name), root) for name in files)
    return sorted(found)


def check():
    global torch
    import tempfile

    root = ARGS["cache_dir"]
    try:
        os.makedirs(root, exist_ok=True)
        handle, probe = tempfile.mkstemp(dir=root, prefix=".doctor-")
        os.write(handle, b"x")
        os.close(handle)
        os.remove(probe)
    except OSError as exc:
        return {"writable": False, "error": f"not writable: {type(exc).__name__}: {exc}"}
    before_files = set(listing(root))
    import torch
    from torch._dynamo.utils import counters

    before = counts(torch, counters)
    compiled = torch.compile(g, backend=ARGS["backend"])
    out = compiled(torch.arange(16, dtype=torch.float32).to(ARGS["device"]))
    synchronize(torch)
    float(out.sum().cpu())
    after = counts(torch, counters)
    written = [name for name in listing(root) if name not in before_files][:2000]
    if "unavailable" in after:
        return {"writable": True, "unavailable": after["unavailable"], "written": written}
    return {
        "writable": True,
        "hits": after["hits"] - before["hits"],
        "misses": after["misses"] - before["misses"],
        "written": written,
    }
"""

_PROCESS_GROUP_SCRIPT = """
def rank_entry(rank, world, rendezvous, out):
    end_with_parent()
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
    )
    pin = ARGS["core_env_var"]
    root_comm = None
    if pin and os.environ.get(pin):  # as run.py does: each rank narrows to its own core of the pair
        if ARGS["root_comm_env"]:  # and the runtime's root-communication port is the lease's own
            root_comm = (ARGS["root_comm_env"], root_comm_port(int(rank_core(os.environ[pin], 0))))
        os.environ[pin] = rank_core(os.environ[pin], rank)
    result = {"rank": rank, "pinned": os.environ.get(pin or "")}
    try:
        import torch
        import torch.distributed as dist

        # Before any seeding or device use: on neuron seeding sizes the device generator table from the
        # cores visible at that moment, and the rank's device index is right only after this call.
        join_process_group(dist, ARGS["backend"], rank, world, rendezvous, root_comm=root_comm)
        result["root_comm"] = os.environ.get(ARGS["root_comm_env"] or "")
        torch.manual_seed(0)
        device = torch.device(ARGS["device"])
        noise = torch.rand(2, device=device)  # device RNG on every rank, after seeding
        value = torch.full((4,), float(rank + 1), device=device)
        dist.all_reduce(value)
        synchronize(torch)
        result.update(sum=value.cpu().tolist(), device=str(value.device), noise=noise.cpu().tolist())
        dist.destroy_process_group()
    except BaseException as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"[:3000]
        result["traceback"] = traceback.format_exc()[-4000:]
    _write(f"{out}.rank{rank}", result)
    if "error" in result:
        sys.exit(1)  # spawn_ranks then stops the other rank instead of leaving it blocked


# run.py's core of a rank (rank_core), rendezvous (join_process_group) and launcher (spawn_ranks),
# spliced in by _common(_LAUNCHER_PARTS):
# @@LAUNCHER@@


def check():
    out, world = sys.argv[1], 2
    failure = spawn_ranks(world, out)
    ranks = []
    for rank in range(world):
        try:
            with open(f"{out}.rank{rank}", encoding="utf-8") as handle:
                ranks.append(json.load(handle))
        except (OSError, ValueError):
            ranks.append({"rank": rank, "error": "died without a result"})
    return {"ranks": ranks, "spawn_error": failure}
"""


#: What every check script takes from templates/common.py: run.py's own way of dying with its parent.
_PRELUDE_PARTS = ("end_with_parent",)
#: What the process-group check takes from templates/common.py, in this order.
_LAUNCHER_PARTS = (
    "rank_core",
    "RENDEZVOUS_TIMEOUT_S",
    "ROOT_COMM_BASE",
    "root_comm_port",
    "join_process_group",
    "spawn_ranks",
)


def _common(names: tuple[str, ...]) -> str:
    """The top-level functions and constants ``names`` of templates/common.py, as source, so a check
    script does what run.py does with run.py's own code. For the process-group check that is run.py's
    rank launcher and rendezvous (:data:`_LAUNCHER_PARTS`): it pins, starts and joins its ranks exactly
    as a sharded run.py does (spawned through the standard library, torch not imported in the
    launcher, the others stopped when one fails, the store on a port rank 0 bound itself)."""
    source = template("common.py")
    parts: dict[str, ast.stmt] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            parts[node.name] = node
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            parts[node.targets[0].id] = node
    return "\n\n\n".join(str(ast.get_source_segment(source, parts[name])) for name in names)


_CHECKPOINT_SCRIPT = """
WORDS = (
    "once upon a time there was little girl who lived in village near the forest she liked to walk "
    "and sing with her friends one day found small bird on ground it could not fly so took home gave "
    "water bread next morning sun came up sky blue happy flew away came back every spring with song "
    "for old man said good night"
).split()


def check():
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = ARGS["out_dir"]
    vocab = {"<pad>": 0, "<unk>": 1}
    for word in WORDS:
        vocab.setdefault(word, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>")
    tokenizer.save_pretrained(out)
    torch.manual_seed(0)
    # No EOS anywhere: random weights must not stop the generation before its tokens are counted.
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=None,
    )
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(pad_token_id=0, bos_token_id=None, eos_token_id=None)
    model.save_pretrained(out)
    return {"vocab": len(vocab), "files": sorted(os.listdir(out))}
"""

_PROMPT = "once upon a time there was a little girl"


# --------------------------------------------------------------------------------------------------
# Running the scripts.


@dataclass(frozen=True)
class _Outcome:
    """How one check script ended.

    Attributes:
        result: what it wrote (its check() dict, or ``error``/``traceback``), or None if it wrote nothing.
        returncode: its exit status (negative: the signal that ended it).
        timed_out: the doctor killed its process group at the timeout.
        log: the tail of its combined stdout and stderr.
    """

    result: Mapping[str, Any] | None
    returncode: int
    timed_out: bool
    log: str

    @property
    def error(self) -> str | None:
        """The failure in words, or None when check() returned normally."""
        if self.result is not None and "error" not in self.result:
            return None
        if self.result is not None:
            return str(self.result["error"])
        if self.timed_out:
            return f"timed out; log: {_tail(self.log)}"
        return f"exit {self.returncode} without a result; log: {_tail(self.log)}"

    def get(self, name: str, default: Any = None) -> Any:
        return default if self.result is None else self.result.get(name, default)


def _tail(text: str, chars: int = 1500) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines)[-chars:] or "(empty)"


def _kill_group(pgid: int) -> None:
    """TERM the group (the script and what it spawned: ranks, compiler workers), then KILL what is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            break
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


class _Running:
    """A started check script (its own session, so a timeout ends everything it started)."""

    def __init__(self, script: Path, out: Path, log: Path, env: Mapping[str, str], python: str) -> None:
        self.out, self.log = out, log
        with contextlib.suppress(FileNotFoundError):
            out.unlink()
        with open(log, "wb") as handle:
            self.proc = subprocess.Popen(
                [python, str(script), str(out)],
                cwd=str(script.parent),
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, deadline: float) -> _Outcome:
        timed_out = False
        try:
            returncode = self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(self.proc.pid)
            returncode = self.proc.wait()
        except BaseException:
            _kill_group(self.proc.pid)
            self.proc.wait()
            raise
        _kill_group(self.proc.pid)  # whatever it left behind (a rank, a compiler worker) goes too
        result: Mapping[str, Any] | None = None
        with contextlib.suppress(OSError, ValueError):
            result = json.loads(self.out.read_text(encoding="utf-8"))
        log = self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""
        return _Outcome(result=result, returncode=returncode, timed_out=timed_out, log=log)


# --------------------------------------------------------------------------------------------------
# The doctor.


@dataclass(frozen=True)
class _Check:
    """One row's definition.

    Attributes:
        key: stable identifier (see :class:`CheckResult`).
        name: the row's title.
        expected: what is assumed, for a kind (from its table fields).
        not_applicable: why the check does not apply to a kind, from the table, or None where it does.
        needs: keys of checks that must have passed (OK) for this one to say anything.
        run: the check itself: (found, passed).
    """

    key: str
    name: str
    expected: Callable[[DeviceKind], str]
    not_applicable: Callable[[DeviceKind], str | None]
    needs: tuple[str, ...]
    run: Callable[[_Doctor], tuple[str, bool]]


def _applies(_: DeviceKind) -> str | None:
    return None


def _exclusive(kind: DeviceKind) -> bool:
    """Whether a core belongs to one process at a time. The table has no field of its own for it: a kind
    that pins processes to cores AND lists cores' owning processes (``owners_command``: the ledger must
    not lease a core someone else holds) is one whose cores are owned exclusively; cuda pins but shares
    a GPU between processes, cpu pins nothing."""
    return kind.core_env_var is not None and kind.owners_command is not None


def _gib(nbytes: int) -> str:
    return f"{nbytes / (1 << 30):.1f} GiB"


def _span(cores: Sequence[int]) -> str:
    if not cores:
        return "none"
    if list(cores) == list(range(cores[0], cores[-1] + 1)):
        return str(cores[0]) if len(cores) == 1 else f"{cores[0]}-{cores[-1]}"
    return ",".join(map(str, cores))


class _Doctor:
    """The state one doctor run builds up, check by check."""

    def __init__(
        self,
        kind: DeviceKind,
        *,
        timeout: float,
        work_dir: Path,
        environ: Mapping[str, str],
        probed: ProbeResult | None = None,
        python: str = sys.executable,
    ) -> None:
        self.kind = kind
        self.timeout = timeout
        self.work_dir = work_dir
        self.environ = dict(environ)
        self.python = python
        self.probed = probed
        self.count = 0
        self.slice: tuple[int, ...] = ()
        self.owned: Mapping[int, int] = {}
        self.owners_listing: object = None
        self.bf16 = False
        self.versions: dict[str, str] = {}
        self.cache_dir = self.environ.get(kind.compile_cache_env) or str(work_dir / "compile-cache")
        self._serial = 0

    # -- helpers -----------------------------------------------------------------------------------

    def device_env(self, cores: Sequence[int]) -> dict[str, str]:
        """A device process's environment: the table's env (the user's own values win, as in run.py),
        pinned to ``cores`` (host numbering, contiguous), the compile cache directory."""
        env = {**self.kind.env, **self.environ}
        if cores:
            env.update(self.kind.pin_cores(cores[0], len(cores)))
        env[self.kind.compile_cache_env] = self.cache_dir
        return env

    def cpu_env(self) -> dict[str, str]:
        """A process that must not touch the device: no pinning, no device backend autoloaded."""
        pins = {k.core_env_var for k in DEVICES.values() if k.core_env_var}
        return {**{k: v for k, v in self.environ.items() if k not in pins}, **NO_DEVICE_ENV}

    def script_args(self, **extra: Any) -> dict[str, Any]:
        return {
            "device": self.kind.device_map,
            "memory_module": self.kind.memory_module,
            "core_env_var": self.kind.core_env_var,
            **extra,
        }

    def start(self, name: str, body: str, args: Mapping[str, Any], env: Mapping[str, str]) -> _Running:
        self._serial += 1
        stem = f"{self._serial:02d}-{name}"
        script = self.work_dir / f"{stem}.py"
        literal = pprint.pformat(dict(args), sort_dicts=False, width=100)
        script.write_text(
            _PRELUDE.format(name=name, file=script.name, args=literal)
            + _common(_PRELUDE_PARTS)
            + "\n\n"
            + body
            + _EPILOGUE,
            encoding="utf-8",
        )
        return _Running(script, self.work_dir / f"{stem}.json", self.work_dir / f"{stem}.log", env, self.python)

    def run(self, name: str, body: str, args: Mapping[str, Any], env: Mapping[str, str]) -> _Outcome:
        return self.start(name, body, args, env).wait(time.monotonic() + self.timeout)

    def free_cores(self, count: int) -> tuple[int, ...] | None:
        """``count`` cores of this session's slice that no process outside it holds, contiguous in host
        numbering (a pinning variable may take only a range), or None when the slice has none."""
        free = [c for c in self.slice if c not in self.owned]
        for index in range(len(free) - count + 1):
            block = free[index : index + count]
            if block[-1] - block[0] == count - 1:
                return tuple(block)
        return None

    def cores_text(self, cores: Sequence[int]) -> str:
        pin = self.kind.pin_cores(cores[0], len(cores)) if cores else {}
        return ", ".join(f"{k}={v}" for k, v in pin.items()) or "no pinning"

    # -- the checks ----------------------------------------------------------------------------------

    def check_imports(self) -> tuple[str, bool]:
        kind = self.kind
        outcome = self.run(
            "imports", _IMPORTS_SCRIPT, self.script_args(runtime_module=kind.runtime_module), self.device_env(())
        )
        if outcome.error is not None:
            return f"import failed: {outcome.error}", False
        self.versions.update(
            torch=str(outcome.get("torch")),
            transformers=str(outcome.get("transformers")),
            python=str(outcome.get("python")),
        )
        found = [f"torch {outcome.get('torch')}", f"transformers {outcome.get('transformers')}"]
        if kind.runtime_module is None:
            found.append(f"device package: none for {kind.name} (runtime_module is None)")
            return "; ".join(found), True
        self.versions[kind.runtime_module] = str(outcome.get("runtime_version"))
        found.append(f"{kind.runtime_module} {outcome.get('runtime_version')}")
        passed = True
        if not outcome.get("autoloaded"):
            found.append(f"NOT autoloaded by `import torch` (run.py never imports {kind.runtime_module})")
            passed = False
        if kind.memory_module and not outcome.get("registered"):
            found.append(f"torch.{kind.memory_module} missing after `import torch`")
            passed = False
        quiet = self.run("no-autoload", _NO_AUTOLOAD_SCRIPT, {"runtime_module": kind.runtime_module}, self.cpu_env())
        if quiet.error is not None:
            found.append(f"under {_env_text(NO_DEVICE_ENV)}: {quiet.error}")
            passed = False
        elif quiet.get("loaded"):
            found.append(f"still loaded under {_env_text(NO_DEVICE_ENV)}: CPU-side runs would touch the device")
            passed = False
        else:
            found.append(f"kept out under {_env_text(NO_DEVICE_ENV)}")
        return "; ".join(found), passed

    def check_device(self) -> tuple[str, bool]:
        kind = self.kind
        try:
            seen = self.probed if self.probed is not None and kind.name in self.probed.counts else None
            seen = seen or probe((kind.name,), python=self.python, timeout=self.timeout)
        except Exception as exc:
            return f"probe failed: {exc}", False
        self.count = seen.counts.get(kind.name, 0)
        if self.count < 1:
            # probe() reads a failing expression as 0: evaluate it once more to show why.
            why = self.run("count", _EVAL_SCRIPT, {"expr": kind.count_expr}, self.device_env(()))
            detail = f"raises {why.error}" if why.error else f"evaluates to {why.get('value')} without an error"
            return f"no {kind.name} device visible to torch: `{kind.count_expr}` {detail}", False
        found = f"{self.count} reported"
        if kind.max_pool:
            found += f" (a session's pool may hold up to {kind.max_pool} slots: max_pool)"
        memory = seen.core_memory.get(kind.name)
        if kind.memory_expr is None:
            found += f"; no per-core memory ({kind.name} plans as {_gib(fallback_core_bytes(kind))} per core)"
        elif kind.memory_needs_pinning:
            # Unpinned, the read would initialise the runtime over every core of the host (memory_needs_pinning).
            found += (
                f"; per-core memory not read here (memory_needs_pinning): check 5 reads `{kind.memory_expr}` "
                f"pinned to a free core; planning uses {_gib(fallback_core_bytes(kind))} (LNC table)"
            )
        elif memory is None:
            found += f"; `{kind.memory_expr}` unreadable: planning falls back to {_gib(fallback_core_bytes(kind))}"
        else:
            found += f"; {_gib(memory)} per core (table fallback {_gib(fallback_core_bytes(kind))})"
        return found, True

    def check_slice(self) -> tuple[str, bool]:
        kind = self.kind
        reported = kind.max_pool or self.count
        try:
            self.slice = session_cores(kind.visible_env_vars, reported, self.environ)
        except ValueError as exc:
            return f"unreadable: {exc}", False
        source = next(
            (
                f"{n}={self.environ[n]}"
                for n in ("NEURON_SUPPORT_VISIBLE_CORES", *kind.visible_env_vars)
                if self.environ.get(n, "").strip()
            ),
            f"all {reported} reported",
        )
        found = f"cores {_span(self.slice)} ({len(self.slice)}, from {source})"
        if not self.slice:
            return f"{found}: empty", False
        contiguous = list(self.slice) == list(range(self.slice[0], self.slice[-1] + 1))
        if kind.core_env_contiguous:
            if not contiguous:
                return f"{found}: NOT contiguous, but {kind.core_env_var} takes only a range", False
            return f"{found}; contiguous", True
        why = f"{kind.core_env_var} takes a list" if kind.core_env_var else "no pinning variable"
        return f"{found}; contiguity not required ({why})", True

    def check_owners(self) -> tuple[str, bool]:
        command = self.kind.owners_command
        assert command is not None
        shown = " ".join(command)
        if shutil.which(command[0]) is None:
            return f"`{command[0]}` not found on PATH", False
        try:
            proc = subprocess.run(list(command), capture_output=True, text=True, timeout=self.timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"`{shown}` failed: {exc}", False
        if proc.returncode != 0:
            return f"`{shown}` exited {proc.returncode}: {_tail(proc.stderr or proc.stdout)}", False
        try:
            data = json.loads(proc.stdout)
        except ValueError as exc:
            return f"`{shown}` printed no JSON ({exc}): {proc.stdout[:300]!r}", False
        layout = _neuron_ls_layout(data)
        if layout is not None:
            return f"`{shown}`: {layout}; output starts {proc.stdout[:300]!r}", False
        self.owners_listing = data
        self.owned = {core: pid for core, pid in parse_neuron_ls(data).items() if pid != os.getpid()}
        devices = data if isinstance(data, list) else data["neuron_devices"]
        keys = sorted({k for d in devices if isinstance(d, dict) for k in d})
        listed = sum(len(_device_cores(d, i)) for i, d in enumerate(devices) if isinstance(d, dict))
        mine = sorted(set(self.owned) & set(self.slice))
        held = ", ".join(f"{c}: pid {p}" for c, p in sorted(self.owned.items())) or "none"
        found = f"{len(devices)} device(s), {listed} core(s) listed (keys: {', '.join(keys)}); held: {held}"
        if mine:
            found += f"; {len(mine)} of this slice's cores held by others ({_span(mine)}): the checks avoid them"
        return found, True

    def check_core_ids(self) -> tuple[str, bool]:
        kind = self.kind
        pinned = next(
            (f"{v}={self.environ[v]}" for v in kind.visible_env_vars if self.environ.get(v, "").strip()), None
        )
        return core_numbering(self.owners_listing, self.count, self.slice, pinned, logical_nc_config(self.environ))

    def check_memory(self) -> tuple[str, bool]:
        cores = self.free_cores(1)
        if cores is None:
            return "no free core in this session's slice", False
        module = self.kind.memory_module
        args = self.script_args(memory_expr=self.kind.memory_expr)
        outcome = self.run("memory", _MEMORY_SCRIPT, args, self.device_env(cores))
        if outcome.error is not None:
            return f"{self.cores_text(cores)}: {outcome.error}", False
        peak, size = int(outcome.get("max_memory_allocated", 0)), int(outcome.get("tensor_bytes", 0))
        found = (
            f"{self.cores_text(cores)}: torch.{module}.max_memory_allocated() = {peak} B, memory_allocated() = "
            f"{outcome.get('memory_allocated')} B for a {size} B tensor on {outcome.get('device')}"
        )
        core_memory = outcome.get("core_memory")
        if core_memory is not None:
            # Shown, not judged (as check 2 did before): which of the two is right is for a human to read.
            found += (
                f"; `{self.kind.memory_expr}` = {_gib(int(core_memory))} per core pinned "
                f"(table fallback {_gib(fallback_core_bytes(self.kind))})"
            )
        return found, peak >= size > 0

    def check_bf16(self) -> tuple[str, bool]:
        cores = self.free_cores(1)
        if cores is None:
            return "no free core in this session's slice", False
        outcome = self.run("bf16", _BF16_SCRIPT, self.script_args(), self.device_env(cores))
        if outcome.error is not None:
            return f"{self.cores_text(cores)}: {outcome.error}", False
        diff = float(outcome.get("max_rel_diff", float("inf")))
        self.bf16 = diff <= BF16_RTOL and outcome.get("dtype") == "torch.bfloat16"
        found = f"{outcome.get('dtype')} on {outcome.get('device')}: max relative difference {diff:.2e}"
        if "is_bf16_supported" in (outcome.result or {}):
            found += f"; is_bf16_supported() = {outcome.get('is_bf16_supported')}"
        return found, self.bf16

    def check_two_processes(self) -> tuple[str, bool]:
        free = [c for c in self.slice if c not in self.owned]
        if len(free) < 2:
            return f"this session's free cores are {_span(free)}: two are needed", False
        first, second = (free[0],), (free[1],)
        ready = [self.work_dir / f"two-ready-{i}" for i in (0, 1)]
        release = self.work_dir / "two-release"
        procs = [
            self.start(
                f"hold-{i}",
                _HOLD_SCRIPT,
                self.script_args(
                    ready_file=str(ready[i]),
                    wait_for=str(ready[1 - i]),
                    release_file=str(release),
                    wait_s=self.timeout,
                    hold_s=HOLD_S,
                ),
                self.device_env(cores),
            )
            for i, cores in enumerate((first, second))
        ]
        deadline = time.monotonic() + self.timeout
        # One that ends before both hold their cores has failed: let the other stop waiting for it.
        while not all(r.exists() for r in ready) and time.monotonic() < deadline:
            if any(p.poll() is not None for p in procs):
                release.touch()
                break
            time.sleep(0.05)
        outcomes = [p.wait(deadline) for p in procs]
        texts = []
        for cores, outcome in zip((first, second), outcomes, strict=True):
            texts.append(f"{self.cores_text(cores)}: {outcome.error or 'held ' + str(outcome.get('device'))}")
        if any(o.error is not None for o in outcomes):
            return "; ".join(texts), False
        overlap = min(float(o.get("done")) for o in outcomes) - max(float(o.get("ready")) for o in outcomes)
        both = all(o.get("partner_ready") for o in outcomes)
        return f"{'; '.join(texts)}; both held at once for {overlap:.1f} s", both and overlap > 0

    def check_refused(self) -> tuple[str, bool]:
        cores = self.free_cores(1)
        if cores is None:
            return "no free core in this session's slice", False
        ready, release = self.work_dir / "refused-ready", self.work_dir / "refused-release"
        holder = self.start(
            "holder",
            _HOLD_SCRIPT,
            self.script_args(ready_file=str(ready), release_file=str(release), wait_s=0, hold_s=self.timeout),
            self.device_env(cores),
        )
        deadline = time.monotonic() + self.timeout
        try:
            while not ready.exists() and holder.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if not ready.exists():
                outcome = holder.wait(time.monotonic())
                return f"the first process could not hold {self.cores_text(cores)}: {outcome.error}", False
            second = self.run("second", _ALLOCATE_SCRIPT, self.script_args(), self.device_env(cores))
        finally:
            release.touch()
            held = holder.wait(deadline + 30)
        if second.timed_out:
            return (
                f"the second process on {self.cores_text(cores)} neither failed nor finished within "
                f"{self.timeout:.0f} s: it waited for the core instead of being refused",
                False,
            )
        if second.error is None:
            return (
                f"the second process allocated on {second.get('device')} ({self.cores_text(cores)}) while the first "
                "held it: cores are not exclusive",
                False,
            )
        found = f"second on {self.cores_text(cores)} refused: {second.error}"
        if held.error is not None:
            return f"{found}; but the first failed too: {held.error}", False
        return found, True

    def check_compile(self) -> tuple[str, bool]:
        cores = self.free_cores(1)
        if cores is None:
            return "no free core in this session's slice", False
        args = self.script_args(backend=self.kind.compile_backend)
        outcome = self.run("compile", _COMPILE_SCRIPT, args, self.device_env(cores))
        if outcome.error is not None:
            return f"backend {self.kind.compile_backend}: {outcome.error}", False
        graphs, diff = int(outcome.get("graphs", 0)), float(outcome.get("max_rel_diff", float("inf")))
        found = f"{graphs} graph(s) compiled on {outcome.get('device')}; max relative difference to eager {diff:.1e}"
        return found, graphs >= 1 and diff <= 1e-4

    def check_cache(self) -> tuple[str, bool]:
        cores = self.free_cores(1)
        if cores is None:
            return "no free core in this session's slice", False
        kind = self.kind
        args = self.script_args(
            backend=kind.compile_backend, cache_dir=self.cache_dir, cache_stats_expr=kind.cache_stats_expr
        )
        outcome = self.run("cache", _CACHE_SCRIPT, args, self.device_env(cores))
        where = f"{kind.compile_cache_env}={self.cache_dir}"
        if outcome.error is not None:
            return f"{where}: {outcome.error}", False
        written = outcome.get("written", [])
        shown = ", ".join(written[:2]) + (f" (+{len(written) - 2} more)" if len(written) > 2 else "")
        wrote = f"wrote {len(written)} file(s)" + (f": {shown}" if written else "")
        unavailable = outcome.get("unavailable")
        if unavailable is not None:
            # The runs go on without counters (rows record them as unknown), so this alone is no reason to
            # stop a sweep (a FAIL stops the shard); the row says so in capitals instead.
            found = (
                f"{where}: writable; counters UNAVAILABLE on this wheel (`{kind.cache_stats_expr}` raises "
                f"{unavailable}): rows record persistent_cache_hits/misses as unknown; {wrote}"
            )
            return found, True
        hits, misses = int(outcome.get("hits", 0)), int(outcome.get("misses", 0))
        found = f"{where}: writable; one compile counted {hits} hit(s), {misses} miss(es); {wrote}"
        return found, hits + misses >= 1

    def check_compiler(self) -> tuple[str, bool]:
        from pytest_neuron_support.run.devices import compiler_version
        from pytest_neuron_support.viewer.report import neff_sync_command  # the neffcache module will own the prefix

        kind = self.kind
        version = compiler_version(kind, python=self.python, timeout=self.timeout)
        if version == "none":
            # compiler_version says "none" on any failure: show the error once.
            why = self.run("compiler", _EVAL_SCRIPT, {"expr": kind.compiler_version_expr}, self.cpu_env())
            return f"`{kind.compiler_version_expr}`: {why.error or why.get('value')}", False
        self.versions["compiler"] = version
        command = neff_sync_command(version)
        if command is None:
            return f"{version}; no NEFF bucket prefix for it", False
        prefix = command.split()[3] if len(command.split()) > 3 else command
        return f"{version}; bucket prefix {prefix}", True

    def check_fallback_ops(self) -> tuple[str, bool]:
        cores = self.free_cores(1)
        if cores is None:
            return "no free core in this session's slice", False
        outcome = self.run("fallback-ops", _EVAL_SCRIPT, {"expr": self.kind.fallback_ops_expr}, self.device_env(cores))
        if outcome.error is not None:
            return f"`{self.kind.fallback_ops_expr}`: {outcome.error}", False
        return f"`{self.kind.fallback_ops_expr}` = {outcome.get('value')}", True

    def check_process_group(self) -> tuple[str, bool]:
        cores = self.free_cores(2)
        if cores is None:
            free = [c for c in self.slice if c not in self.owned]
            return f"this session's free cores are {_span(free)}: two adjacent ones are needed", False
        args = self.script_args(backend=self.kind.dist_backend, root_comm_env=self.kind.root_comm_env)
        script = _PROCESS_GROUP_SCRIPT.replace("# @@LAUNCHER@@", _common(_LAUNCHER_PARTS))
        outcome = self.run("process-group", script, args, self.device_env(cores))
        if outcome.error is not None:
            return f"{self.cores_text(cores)}: {outcome.error}", False
        ranks: list[Mapping[str, Any]] = list(outcome.get("ranks", []))
        texts, passed = [], True
        for rank in ranks:
            pinned = f" ({self.kind.core_env_var}={rank.get('pinned')})" if self.kind.core_env_var else ""
            if "error" in rank:
                texts.append(f"rank {rank.get('rank')}{pinned}: {rank['error']}")
                passed = False
                continue
            values = rank.get("sum") or []
            comm = f", {self.kind.root_comm_env}={rank.get('root_comm')}" if self.kind.root_comm_env else ""
            texts.append(f"rank {rank.get('rank')}{pinned}{comm} on {rank.get('device')}: sum {values[:1]}")
            passed = passed and values == [3.0] * 4
        if self.kind.core_env_var and len({r.get("pinned") for r in ranks}) != len(ranks):
            texts.append("ranks were NOT pinned to distinct cores")
            passed = False
        if outcome.get("spawn_error") and passed:
            texts.append(f"spawn: {outcome.get('spawn_error')}")
            passed = False
        return f"{self.kind.dist_backend}: " + "; ".join(texts), passed and len(ranks) == 2

    def check_generation(self) -> tuple[str, bool]:
        from pytest_neuron_support.run.runscript import RunSpec, render_and_run

        cores = self.free_cores(1)
        if cores is None:
            return "no free core in this session's slice", False
        checkpoint = self.work_dir / "tiny-llama"
        built = self.run("checkpoint", _CHECKPOINT_SCRIPT, {"out_dir": str(checkpoint)}, self.cpu_env())
        if built.error is not None:
            return f"could not build the tiny checkpoint (on CPU): {built.error}", False
        dtype = "bfloat16" if self.bf16 else "float32"
        spec = RunSpec(
            model=str(checkpoint.resolve()),
            revision="main",
            task="text-generation",
            dtype=dtype,
            prompt=_PROMPT,
            max_new_tokens=GENERATION_TOKENS,
            device=self.kind,
            compile=True,
            compile_backend=self.kind.compile_backend,
        )
        env = {**self.device_env(cores), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        _, outcome = render_and_run(
            spec, self.work_dir / "generation", env=env, timeout=self.timeout, python=self.python
        )
        result = outcome.result
        where = f"{dtype}, {self.cores_text(cores)}"
        if outcome.timed_out:
            return f"{where}: timed out at stage {outcome.last_stage}", False
        if result is None:
            return f"{where}: exit {outcome.returncode} without a result: {_tail(outcome.log_tail())}", False
        if not result.get("ok"):
            return f"{where}: failed at {result.get('stage')}: {result.get('error_type')}: {result.get('error')}", False
        tokens = list(result.get("tokens") or [])
        graphs = int(result.get("graphs_compiled") or 0)
        same = bool(result.get("repeat_identical"))
        cache = result.get("compile_cache") or {}
        counted = (
            f"persistent cache counters unknown ({cache['unavailable']})"
            if cache.get("unavailable")
            else f"persistent cache {cache.get('hits')} hit(s), {cache.get('misses')} miss(es)"
        )
        found = (
            f"{where}: {len(tokens)} token(s) {tokens}, {graphs} graph(s) compiled, "
            f"repeat {'identical' if same else 'DIFFERENT'}, {counted}, {float(result.get('wall_s') or 0):.1f} s"
        )
        return found, len(tokens) == GENERATION_TOKENS and graphs >= 1 and same


def _env_text(env: Mapping[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in env.items())


def _device_cores(device: Mapping[str, Any], index: int) -> list[int]:
    count = int(device.get("nc_count") or device.get("neuroncore_count") or 0)
    ids = device.get("neuroncore_ids")
    first = int(device.get("neuron_device", index)) * count
    return [int(i) for i in ids] if isinstance(ids, list) else list(range(first, first + count))


def core_numbering(listing: object, count: int, pool: Sequence[int], pinned: str | None, lnc: int) -> tuple[str, bool]:
    """Whether ``neuron-ls -j``'s core ids (``listing``, the layout check 4 accepted) number cores as the
    pinning does: ``count`` is ``device_count()`` in the doctor's environment (logical cores, LNC
    ``lnc``), ``pool`` this session's slice in host numbering, ``pinned`` the variable that restricted the
    doctor's own view (``NEURON_RT_VISIBLE_CORES=8-15``) or None. The ledger marks the cores
    ``parse_neuron_ls`` reads as owned and pins children to pool numbers: if neuron-ls counted physical
    cores (8 a trn2 chip) where the runtime counts logical ones (4 at LNC=2), it would mark and avoid the
    wrong cores. Returns (found, passed)."""
    devices = listing["neuron_devices"] if isinstance(listing, dict) else listing
    if not isinstance(devices, list):
        return f"no neuron-ls listing to compare (got {type(listing).__name__})", False
    ids = sorted({c for i, d in enumerate(devices) if isinstance(d, dict) for c in _device_cores(d, i)})
    per_device = sorted({len(_device_cores(d, i)) for i, d in enumerate(devices) if isinstance(d, dict)})
    listed = len(ids)
    found = (
        f"neuron-ls lists {listed} core id(s) ({_span(ids)}; {'/'.join(map(str, per_device))} per device) over "
        f"{len(devices)} device(s); device_count() = {count}"
        + (f" under {pinned}" if pinned else " (unpinned)")
        + f"; LNC={lnc}; pool {_span(pool)}"
    )
    problems = []
    if ids != list(range(listed)):
        problems.append(f"the ids are not 0..{listed - 1}, the zero-based numbering NEURON_RT_VISIBLE_CORES takes")
    if pinned is None and listed != count:
        if listed == count * lnc:
            problems.append(
                f"neuron-ls numbers PHYSICAL cores ({listed} = {count} logical x LNC {lnc}) where the pinning and "
                "device_count() number logical ones: owners would be marked on the wrong cores"
            )
        else:
            problems.append(f"{listed} listed != {count} visible to the runtime")
    if pinned is not None:
        # The runtime sees what its own variable names; the session's slice (NEURON_SUPPORT_VISIBLE_CORES)
        # may be narrower, and is checked against the listing below.
        named = parse_cores(pinned.partition("=")[2])
        if count != len(named):
            problems.append(f"device_count() = {count} under {pinned}, which names {len(named)} core(s)")
    outside = [c for c in pool if c not in set(ids)]
    if outside:
        problems.append(f"pool core(s) {_span(outside)} are not listed by neuron-ls")
    if problems:
        return f"{found}: MISMATCH: " + "; ".join(problems), False
    return f"{found}: consistent", True


def _neuron_ls_layout(data: object) -> str | None:
    """Why ``data`` is not the layout :func:`~pytest_neuron_support.cores.parse_neuron_ls` reads, or None.

    parse_neuron_ls reads anything it does not recognise as "nothing owned": here that must be a
    failure, since the layout is an inference (docs) that only this check tests."""
    if isinstance(data, dict):
        if "neuron_devices" not in data:
            return f"a JSON object without 'neuron_devices' (keys: {', '.join(sorted(data))})"
        data = data["neuron_devices"]
    if not isinstance(data, list):
        return f"JSON {type(data).__name__}, not a list of devices"
    if not data:
        return "an empty device list"
    for index, device in enumerate(data):
        if not isinstance(device, dict):
            return f"device {index} is a JSON {type(device).__name__}, not an object"
        if not _device_cores(device, index):
            return f"device {index} names no cores (no nc_count, neuroncore_count, neuroncore_ids: {sorted(device)})"
        processes = device.get("neuron_processes")
        if processes is not None and not (
            isinstance(processes, list)
            and all(isinstance(p, dict) and isinstance(p.get("pid"), int) for p in processes)
        ):
            return (
                f"device {index}: 'neuron_processes' is not a list of objects with an integer 'pid': {processes!r:.200}"
            )
    return None


def _checks() -> tuple[_Check, ...]:
    device = ("imports", "device")
    return (
        _Check(
            "imports",
            "torch imports (and the device package)",
            lambda k: (
                "torch and transformers import"
                + (
                    f"; {k.runtime_module} imports, is autoloaded by `import torch` (torch.{k.memory_module} present) "
                    f"and stays out under {_env_text(NO_DEVICE_ENV)}"
                    if k.runtime_module
                    else ""
                )
            ),
            _applies,
            (),
            _Doctor.check_imports,
        ),
        _Check(
            "device",
            "device available, core count",
            lambda k: f"probe(): `{k.count_expr}` >= 1",
            _applies,
            ("imports",),
            _Doctor.check_device,
        ),
        _Check(
            "slice",
            "this session's visible slice",
            lambda k: (
                "session_cores("
                + ", ".join(("NEURON_SUPPORT_VISIBLE_CORES", *k.visible_env_vars))
                + ") readable, non-empty"
                + (f", contiguous ({k.core_env_var} takes a range)" if k.core_env_contiguous else "")
            ),
            _applies,
            device,
            _Doctor.check_slice,
        ),
        _Check(
            "owners",
            "cores held by others",
            lambda k: (
                f"`{' '.join(k.owners_command)}` runs and prints JSON that cores.parse_neuron_ls reads"
                if k.owners_command
                else "a listing of the processes that own cores (owners_command)"
            ),
            lambda k: (
                None
                if k.owners_command is not None
                else f"{k.name} lists no owners of its cores (owners_command is None)"
            ),
            (),
            _Doctor.check_owners,
        ),
        _Check(
            "memory",
            "memory API after synchronize()",
            lambda k: (
                f"torch.{k.memory_module or '<memory_module>'}.max_memory_allocated() >= a 1 MiB tensor's size "
                "after synchronize()"
            ),
            lambda k: None if k.memory_module else f"{k.name} has no device memory statistics (memory_module is None)",
            (*device, "slice"),
            _Doctor.check_memory,
        ),
        _Check(
            "bf16",
            "bf16 matmul",
            lambda k: f"a 64x64 bf16 matmul on {k.device_map} equals the CPU's within rtol {BF16_RTOL}",
            _applies,
            (*device, "slice"),
            _Doctor.check_bf16,
        ),
        _Check(
            "two-processes",
            "two 1-core processes at once",
            lambda k: (
                f"two processes pinned to distinct cores ({k.core_env_var or 'no pinning variable'}) both "
                f"allocate and hold the device {HOLD_S:.0f} s, overlapping"
            ),
            _applies,
            (*device, "slice"),
            _Doctor.check_two_processes,
        ),
        _Check(
            "exclusive",
            "second process on a taken core refused",
            lambda k: (
                f"a second process pinned with {k.core_env_var or '<core_env_var>'} to a core a first process "
                "holds fails at runtime init"
            ),
            lambda k: (
                None
                if _exclusive(k)
                else f"{k.name} cores are not exclusive by the table (core_env_var={k.core_env_var}, "
                f"owners_command={k.owners_command})"
            ),
            (*device, "slice"),
            _Doctor.check_refused,
        ),
        _Check(
            "compile",
            "torch.compile with the device backend",
            lambda k: f"torch.compile(fn, backend={k.compile_backend!r}) equals eager, unique_graphs >= 1",
            _applies,
            (*device, "slice"),
            _Doctor.check_compile,
        ),
        _Check(
            "compile-cache",
            "compile cache dir and counters",
            lambda k: (
                f"{k.compile_cache_env} writable; after a compile, "
                + (
                    f"`{k.cache_stats_expr}` persistent_hits + persistent_misses >= 1"
                    + (f" ({_env_text(k.env)})" if k.env else "")
                    + ", or the row says the counters are UNAVAILABLE on this wheel"
                    if k.cache_stats_expr
                    else "inductor's fxgraph_cache_hit + fxgraph_cache_miss >= 1"
                )
            ),
            _applies,
            (*device, "slice"),
            _Doctor.check_cache,
        ),
        _Check(
            "compiler",
            "compiler version, NEFF bucket prefix",
            lambda k: (
                f"`{k.compiler_version_expr or '<compiler_version_expr>'}` readable (local label kept) and "
                "mapped to a NEFF bucket prefix by viewer.neff_sync_command"
            ),
            lambda k: (
                None
                if k.compiler_version_expr is not None
                else f"{k.name} has no compiler of its own (compiler_version_expr is None)"
            ),
            (),
            _Doctor.check_compiler,
        ),
        _Check(
            "fallback-ops",
            "fallback ops readable",
            lambda k: (
                f"`{k.fallback_ops_expr or '<fallback_ops_expr>'}` evaluates (ops the eager prefill ran on the host)"
            ),
            lambda k: (
                None
                if k.fallback_ops_expr is not None
                else f"nothing falls back to the host on {k.name} (fallback_ops_expr is None)"
            ),
            (*device, "slice"),
            _Doctor.check_fallback_ops,
        ),
        _Check(
            "process-group",
            "2-rank process group",
            lambda k: (
                f"spawned ranks, one core each, init_process_group({k.dist_backend!r}) before seeding, "
                "all_reduce on the device = 3"
            ),
            _applies,
            (*device, "slice"),
            _Doctor.check_process_group,
        ),
        _Check(
            "generation",
            "tiny generation through run.py",
            lambda k: (
                f"run.py (compile, backend {k.compile_backend!r}) on a tiny llama: ok, "
                f"{GENERATION_TOKENS} tokens, graphs_compiled >= 1, repeat identical"
            ),
            _applies,
            (*device, "slice"),
            _Doctor.check_generation,
        ),
        _Check(
            "core-ids",
            "neuron-ls core ids vs the pinning's",
            lambda k: (
                "the owners listing's core ids are 0..N-1 and as many as device_count() (logical cores at this "
                "LNC, not physical); the pool's cores are among them"
            ),
            lambda k: (
                None
                if k.owners_command is not None
                else f"{k.name} lists no owners of its cores (owners_command is None)"
            ),
            ("device", "slice", "owners"),
            _Doctor.check_core_ids,
        ),
    )


#: The doctor's checks, in table order.
CHECKS: tuple[_Check, ...] = _checks()


def resolve_device(choice: str, timeout: float = DEFAULT_TIMEOUT_S) -> tuple[str, ProbeResult | None]:
    """``--device`` to a kind, probing (in a subprocess) only for ``auto``; a probe that fails resolves
    to cpu, where the device check then says why."""
    if choice != "auto":
        return choice, None
    try:
        seen = probe(AUTO_ORDER, timeout=timeout)
    except Exception:
        return "cpu", None
    return seen.resolve("auto"), seen


def selected_checks(only: Collection[str] | None = None) -> tuple[_Check, ...]:
    """The checks ``only`` names (keys) and every check they need, in table order; all when None."""
    if not only:
        return CHECKS
    by_key = {c.key: c for c in CHECKS}
    unknown = sorted(set(only) - set(by_key))
    if unknown:
        raise ValueError(f"unknown check(s) {', '.join(unknown)}; choose from {', '.join(by_key)}")
    wanted: set[str] = set()
    pending = list(only)
    while pending:
        key = pending.pop()
        if key not in wanted:
            wanted.add(key)
            pending.extend(by_key[key].needs)
    return tuple(c for c in CHECKS if c.key in wanted)


def run_doctor(
    kind: DeviceKind,
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    environ: Mapping[str, str] | None = None,
    probed: ProbeResult | None = None,
    progress: Callable[[CheckResult], None] | None = None,
    only: Collection[str] | None = None,
) -> Report:
    """Run the checks for ``kind`` (all, or ``only`` those keys and what they need) and return the report;
    the work directory is removed when every check passed. ``environ`` is the environment the checks
    see (default this process's): the session's slice, a compile cache directory, PATH."""
    checks = selected_checks(only)
    work_dir = Path(tempfile.mkdtemp(prefix=f"neuron-support-doctor-{kind.name}-"))
    doctor = _Doctor(
        kind,
        timeout=timeout,
        work_dir=work_dir,
        environ=dict(os.environ if environ is None else environ),
        probed=probed,
    )
    results: dict[str, CheckResult] = {}
    numbers = {c.key: n for n, c in enumerate(CHECKS, start=1)}
    for check in checks:
        number = numbers[check.key]
        start = time.monotonic()
        reason = check.not_applicable(kind)
        unmet = [results[n] for n in check.needs if results[n].status != OK]
        if reason is not None:
            status, found = NA, f"does not apply: {reason}"
        elif unmet:
            # Name the prerequisites that failed (the root cause), not the ones that were not run because of them.
            roots = [u for u in unmet if u.status == FAIL] or unmet
            status = NOT_RUN
            found = "not run: needs " + ", ".join(f"check {u.number} ({u.name}), which is {u.status}" for u in roots)
        else:
            try:
                found, passed = check.run(doctor)
            except Exception as exc:  # a check's own bug must not hide the other rows
                found, passed = f"the check itself failed: {type(exc).__name__}: {exc}", False
            status = OK if passed else FAIL
        result = CheckResult(
            number, check.key, check.name, check.expected(kind), found, status, round(time.monotonic() - start, 2)
        )
        results[check.key] = result
        if progress is not None:
            progress(result)
    report = Report(
        device=kind.name,
        checks=tuple(results.values()),
        versions=dict(doctor.versions, python=doctor.versions.get("python", platform.python_version())),
        timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        work_dir=str(work_dir),
    )
    if report.passed:
        shutil.rmtree(work_dir, ignore_errors=True)
    return report


_WIDTHS = {"check": 34, "expected": 46, "found": 64, "status": 7}


def format_table(checks: Sequence[CheckResult]) -> str:
    """The checks as a text table (cells wrapped, long error texts cut: the JSON has them whole)."""
    columns = list(_WIDTHS)
    rule = "-+-".join("-" * _WIDTHS[c] for c in columns)
    lines = [" | ".join(c.ljust(_WIDTHS[c]) for c in columns).rstrip(), rule]
    for check in checks:
        found = check.found if len(check.found) <= 600 else check.found[:600] + " [...]"
        cells = {
            "check": textwrap.wrap(f"{check.number:>2} {check.name}", _WIDTHS["check"]),
            "expected": textwrap.wrap(check.expected, _WIDTHS["expected"]),
            "found": textwrap.wrap(found, _WIDTHS["found"], break_long_words=True),
            "status": [check.status],
        }
        for row in range(max(len(v) for v in cells.values())):
            lines.append(
                " | ".join((cells[c][row] if row < len(cells[c]) else "").ljust(_WIDTHS[c]) for c in columns).rstrip()
            )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The doctor's options (``neuron-support doctor`` and ``python -m pytest_neuron_support.doctor``)."""
    parser.add_argument(
        "--device",
        choices=("auto", *DEVICES),
        default="auto",
        help="device kind to check (default auto: the first of neuron, cuda, cpu that reports a core)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        metavar="S",
        help=f"seconds each check may take (default {DEFAULT_TIMEOUT_S:.0f})",
    )
    parser.add_argument(
        "--only",
        action="append",
        metavar="CHECK",
        choices=[c.key for c in CHECKS],
        help="run only this check and the checks it needs (repeatable): " + ", ".join(c.key for c in CHECKS),
    )


def main(args: argparse.Namespace) -> int:
    """Run the doctor; print the table and a summary; 0 when every check is OK or N/A, else 1."""
    if args.timeout <= 0:
        print(f"neuron-support doctor: --timeout must be positive (got {args.timeout})", file=sys.stderr)
        return 2
    only = getattr(args, "only", None)
    checks = selected_checks(only)
    name, probed = resolve_device(args.device, args.timeout)
    kind = DEVICES[name]
    print(f"neuron-support doctor: checking {name} (--device {args.device}); {len(checks)} checks", flush=True)

    def progress(result: CheckResult) -> None:
        print(
            f"  [{result.number:>2}/{len(CHECKS)}] {result.name}: {result.status} ({result.seconds:.1f} s)", flush=True
        )

    report = run_doctor(kind, timeout=args.timeout, probed=probed, progress=progress, only=only)
    print()
    print(format_table(report.checks))
    print()
    if not report.passed:
        print(f"scripts and logs of the checks: {report.work_dir}")
    if args.json:
        write_atomic(Path(args.json), json.dumps(report.to_json(), indent=2) + "\n")
    print(report.summary())
    return 0 if report.passed else 1
