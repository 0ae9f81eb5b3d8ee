#!/bin/sh
# Manages its own idempotence (idempotence: true): the agent runs it every time.
echo tuned >> /etc/public-demo/tune.count
