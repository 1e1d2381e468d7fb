#!/bin/bash
# Session 20: the machine's clock source and what a clock read costs, before a run of s20.sh.
echo "clocksource: $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource) (available: $(cat /sys/devices/system/clocksource/clocksource0/available_clocksource))"
$(dirname "$0")/clock
