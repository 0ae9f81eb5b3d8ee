#!/bin/sh
test -s /etc/public-demo/tune.count && test -f /etc/public-demo/static.conf
