#!/bin/sh
cmp -s "$SKYHOOK_DIR/configmaps/demo.conf" /etc/public-demo/demo.conf
