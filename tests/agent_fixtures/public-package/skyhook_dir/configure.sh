#!/bin/sh
set -e
mkdir -p /etc/public-demo
cp "$SKYHOOK_DIR/configmaps/demo.conf" /etc/public-demo/demo.conf
