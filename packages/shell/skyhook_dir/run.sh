#!/bin/sh
# shell: run a work script of the package's configMap (see lib.sh), e.g. `run.sh apply.sh`.
set -eu
. "${0%/*}/lib.sh"
run_script "${1:?usage: run.sh SCRIPT (a configMap key such as apply.sh)}" work
