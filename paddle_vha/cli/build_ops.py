"""Build (or reuse) the fused VHA prologue operator for this Paddle, from the sources paddle_vha carries.

    paddle-vha-build-ops            # build once; later runs reuse the build
    paddle-vha-build-ops --force    # rebuild from scratch

In a checkout the sources are ops/ (tools/env.sh runs ops/build.py itself); an installed wheel carries them as
package data (paddle_vha/_ops). Layers build the op on first use anyway; this command does it ahead of time and says
where. Environment variables (VHA_OPS_BUILD_DIR, VHA_OPS_MARCH, CUDA_HOME): see ops/build.py.
"""
from __future__ import annotations

import sys

from . import command, fail, quiet
from .options import ALWAYS, Effect

# ops/build.py owns the parser (paddle_vha.kernels.op_loader.build_script().build_parser()); it refuses an inert
# option with these words
_BUILDS = Effect("unless --digest (which prints the sources' digest and exits)", lambda a: not a.digest)
TAKES_EFFECT = {"--force": _BUILDS, "--verbose": _BUILDS, "--digest": ALWAYS}


def build_parser():
    """ops/build.py's own parser."""
    from ..kernels.op_loader import build_script

    return build_script().build_parser()


@command
def main(argv=None) -> int:
    quiet()
    from ..kernels.op_loader import build_script, ops_source_dir

    if ops_source_dir() is None:
        fail("the fused operator's sources are missing (neither paddle_vha/_ops nor a checkout's ops/ holds build.py)")
    from .options import parse_checked

    argv = sys.argv[1:] if argv is None else list(argv)
    parse_checked(build_parser(), argv, TAKES_EFFECT)
    return build_script().main(argv)


if __name__ == "__main__":
    sys.exit(main())
