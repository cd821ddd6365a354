"""The `specroll` command: one subcommand per job; only the chosen job's module is imported."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, help); each module has `add_arguments(parser)` and `run(args) -> int`.
SUBCOMMANDS = {
    "bench": ("specroll.benchmarks.engine_bench", "benchmark the engine against HF generate / assisted generation"),
    "build-demo-models": ("specroll.demo.cli_build", "build (or rebuild) the cached demo models and tokenizer"),
    "train": ("specroll.integrations.train", "GRPO (TRL) with speculative rollouts and online draft learning"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="specroll", description="Speculative rollouts for RL training.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, help_text) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    if not argv or argv[0] not in SUBCOMMANDS:
        parser.parse_args(argv)  # prints usage / the error for an unknown subcommand
        return 2
    module = importlib.import_module(SUBCOMMANDS[argv[0]][0])
    job_parser = argparse.ArgumentParser(prog=f"specroll {argv[0]}", description=SUBCOMMANDS[argv[0]][1])
    module.add_arguments(job_parser)
    return int(module.run(job_parser.parse_args(argv[1:])) or 0)


if __name__ == "__main__":
    sys.exit(main())
