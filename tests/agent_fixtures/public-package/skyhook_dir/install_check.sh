#!/bin/sh
grep -qx "node=$1" /etc/public-demo/install.env
