#!/bin/sh
# shell: run a check script of the package's configMap (see lib.sh), e.g. `run_check.sh apply_check.sh`.
set -eu
. "${0%/*}/lib.sh"
run_script "${1:?usage: run_check.sh SCRIPT (a configMap key such as apply_check.sh)}" check
