#!/bin/sh
rm -rf /etc/public-demo
