"""The `specroll` command: one subcommand per job; only the chosen job's module is imported.

A user's mistake — a bad command line, a missing config file, a bad config field (`ConfigError`), an
optional extra not installed (`extras.MissingExtra`: the `pip install` line) — is one line on stderr and
exit code 2; `--debug` shows the traceback of such an error. Any other exception is a bug and keeps its
traceback. `--quiet` shows warnings and errors only, `--verbose` debug messages too (`specroll.log`).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import NoReturn

# subcommand -> (module, help); each module has `add_arguments(parser)` and `run(args) -> int`.
SUBCOMMANDS = {
    "bench": ("specroll.bench.engine_bench", "benchmark the engine against HF generate / assisted generation"),
    "build-demo-models": ("specroll.demo.cli_build", "build (or rebuild) the cached demo models and tokenizer"),
    "export": ("specroll.jobs.export", "write a run's checkpoint as a save_pretrained policy and a drafter in the "
               "layout vLLM / speculators / transformers load"),
    "distill": ("specroll.jobs.distill", "train a drafter (EAGLE / Medusa head or drafter LM) for your policy offline"),
    "train": ("specroll.jobs.train", "GRPO (TRL) with speculative rollouts and online draft learning"),
}


class OneLineParser(argparse.ArgumentParser):
    """argparse with its error in one line (the usage is one `--help` away), exit code 2 as argparse's."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = OneLineParser(prog="specroll", description="Speculative rollouts for RL training.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (_, help_text) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    if not argv or argv[0] not in SUBCOMMANDS:
        parser.parse_args(argv)  # prints usage / the error for an unknown subcommand
        return 2
    module = importlib.import_module(SUBCOMMANDS[argv[0]][0])
    job_parser = OneLineParser(prog=f"specroll {argv[0]}", description=SUBCOMMANDS[argv[0]][1])
    module.add_arguments(job_parser)
    job_parser.add_argument("--debug", action="store_true", help="show the traceback of a config error")
    verbosity = job_parser.add_mutually_exclusive_group()
    verbosity.add_argument("--quiet", action="store_const", dest="log_level", const=logging.WARNING,
                           help="show warnings and errors only")
    verbosity.add_argument("--verbose", action="store_const", dest="log_level", const=logging.DEBUG,
                           help="show debug messages too")
    args = job_parser.parse_args(argv[1:])
    from specroll.extras import MissingExtra
    from specroll.integrations.yaml_config import ConfigError
    from specroll.log import set_verbosity

    if args.log_level is not None:
        set_verbosity(args.log_level)
    try:
        return int(module.run(args) or 0)
    except (ConfigError, MissingExtra) as err:
        if args.debug:
            raise
        print(f"{job_parser.prog}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
