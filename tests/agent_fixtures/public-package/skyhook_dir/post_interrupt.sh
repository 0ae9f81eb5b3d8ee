#!/bin/sh
echo after-reboot > /etc/public-demo/post-interrupt
