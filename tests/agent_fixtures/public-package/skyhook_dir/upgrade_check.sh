#!/bin/sh
test "$(cat /etc/public-demo/version)" = "$CURRENT_VERSION"
