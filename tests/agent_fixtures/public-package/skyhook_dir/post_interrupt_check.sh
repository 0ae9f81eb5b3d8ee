#!/bin/sh
test -f /etc/public-demo/post-interrupt
