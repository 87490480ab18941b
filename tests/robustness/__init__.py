"""Bad input, faults and kills: the replayable probe of every command (`probe`) and the
kill/SIGTERM-then-resume rounds (`kill_resume`), run whole by the slow tests here and by hand
for docs/robustness.md."""
