"""Parse a saved model output exactly as the server does.

    python -m reward_tools.parse --backend PRIMO-R1 [--score-mode auto] < output.txt

Prints JSON: score (number or null), ok, parse_status, parse_error, raw_value, score_mode.
"""

from __future__ import annotations

import argparse
import json
import sys

from reward_protocol.score import PROBABILITY_MODES, SCORE_MODES
from reward_server.profiles import UnknownBackend, backend_names, load_profile


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reward_tools.parse", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--backend", required=True, help=f"one of: {', '.join(backend_names())}")
    parser.add_argument(
        "--score-mode",
        default=None,
        choices=[m for m in SCORE_MODES if m not in PROBABILITY_MODES],
        help="default: the profile's (auto)",
    )
    args = parser.parse_args(argv)
    try:
        profile = load_profile(args.backend)
    except UnknownBackend as exc:
        parser.error(str(exc))
    mode = args.score_mode or profile.default_score_mode
    profile.check_score_mode(mode)
    result = profile.parse_text(sys.stdin.read(), mode)
    json.dump(
        {
            "score": result.score,
            "ok": result.ok,
            "parse_status": result.status.value,
            "parse_error": result.error,
            "raw_value": result.raw_value,
            "score_mode": mode,
            "backend": profile.name,
        },
        sys.stdout,
    )
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
