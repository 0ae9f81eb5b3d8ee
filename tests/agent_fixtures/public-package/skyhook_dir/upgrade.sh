#!/bin/sh
# An upgrade step: the agent passes the previous and the new version.
set -e
echo "from=$1 to=$2 env_from=$PREVIOUS_VERSION env_to=$CURRENT_VERSION color=$DEMO_COLOR" > /etc/public-demo/upgrade.log
echo "$2" > /etc/public-demo/version
