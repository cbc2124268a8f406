"""The ``neuron-support`` command: build the tiny zoo, look rows up."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path


def _default_hub_cache() -> Path:
    """The cache huggingface_hub reads: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
    return Path(home) / "hub"


def _zoo_build(args: argparse.Namespace) -> int:
    from . import zoo

    names = args.only or None
    known = {a.name for a in zoo.ARCHS}
    unknown = sorted(set(names or ()) - known)
    if unknown:
        print(
            f"neuron-support zoo build: unknown architecture(s) {', '.join(unknown)}; "
            f"choose from {', '.join(sorted(known))}",
            file=sys.stderr,
        )
        return 2
    cache = Path(args.cache_dir) if args.cache_dir else _default_hub_cache()
    repos = zoo.build_zoo(cache, names)
    print(f"tiny zoo ({len(repos)} checkpoints) installed in {cache}")
    print(f"use it with: HF_HUB_CACHE={cache} HF_HUB_OFFLINE=1")
    return 0


def _show(args: argparse.Namespace) -> int:
    from .dataset import read_dataset

    rows = [r for r in read_dataset(Path(args.results_dir)) if r.model_id == args.model]
    if not rows:
        print(f"no rows for {args.model} under {args.results_dir}/data", file=sys.stderr)
        return 1
    for row in sorted(rows, key=lambda r: (r.neuronx_cc, r.library_version, r.device)):
        stage = f" at {row.failure_stage}" if row.failure_stage else ""
        print(
            f"{row.model_id}  neuronx-cc {row.neuronx_cc}  {row.library} {row.library_version}  {row.device}: "
            f"{row.result}{stage}  cores={row.neuron_cores}  run_s={row.run_s}  compile_s={row.compile_s}"
        )
        if row.error:
            print(f"    {row.error.splitlines()[0]}")
    return 0


def _merge(args: argparse.Namespace) -> int:
    from .dataset import read_dataset, recover_parts, write_rows

    target = Path(args.into)
    total = 0
    for source in map(Path, args.parts):
        if not (source / "data").is_dir() and not (source / ".parts").is_dir():
            print(f"neuron-support merge: {source} holds no dataset (no data/ or .parts/)", file=sys.stderr)
            return 2
        recover_parts(source)  # rows of a shard that was killed before it wrote Parquet
        rows = read_dataset(source)
        write_rows(target, rows)
        total += len(rows)
        print(f"{source}: {len(rows)} rows")
    print(f"merged {total} rows into {target / 'data'}")
    return 0


def _diff(args: argparse.Namespace) -> int:
    from .dataset import diff_datasets, read_dataset

    changes = diff_datasets(read_dataset(Path(args.old)), read_dataset(Path(args.new)))
    counts: dict[str, int] = {}
    for change in changes:
        counts[change.kind] = counts.get(change.kind, 0) + 1
        if change.kind != "unchanged" or args.verbose:
            print(f"{change.kind:<10} {change.model_id} [{change.device}]: {change.old or '-'} -> {change.new or '-'}")
    print(", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) or "no rows")
    return 1 if counts.get("regressed") else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="neuron-support", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    zoo_parser = sub.add_parser("zoo", help="the tiny random-weight checkpoints used to test offline")
    zoo_sub = zoo_parser.add_subparsers(dest="zoo_command", required=True)
    build = zoo_sub.add_parser("build", help="build tiny checkpoints into a Hugging Face hub cache")
    build.add_argument(
        "--cache-dir", help="hub cache to install into (default: HF_HUB_CACHE or ~/.cache/huggingface/hub)"
    )
    build.add_argument("--only", action="append", metavar="ARCH", help="build only this architecture (repeatable)")
    build.set_defaults(func=_zoo_build)
    show = sub.add_parser("show", help="a model's rows across stacks")
    show.add_argument("model", help="Hub id")
    show.add_argument("--results-dir", default="results", help="dataset folder (default results)")
    show.set_defaults(func=_show)
    merge = sub.add_parser("merge", help="combine shards' results folders into one dataset")
    merge.add_argument("parts", nargs="+", help="results folders written by shards (--results-dir of each)")
    merge.add_argument("--into", required=True, help="dataset folder to merge into")
    merge.set_defaults(func=_merge)
    diff = sub.add_parser(
        "diff", help="per model: regressed / fixed / new / missing / unchanged (exit 1 on regressions)"
    )
    diff.add_argument("old", help="dataset folder (the baseline)")
    diff.add_argument("new", help="dataset folder (the candidate)")
    diff.add_argument("-v", "--verbose", action="store_true", help="also list unchanged models")
    diff.set_defaults(func=_diff)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
