# Shortcuts for dev.py, which sets up .venv on first use.
.PHONY: run test sim bench setup
run:   ; python3 dev.py run
test:  ; python3 dev.py test
sim:   ; python3 dev.py sim
bench: ; python3 dev.py bench
setup: ; python3 dev.py setup
