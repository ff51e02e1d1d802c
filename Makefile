# Shortcuts for dev.py, which sets up .venv on first use.
.PHONY: run test test-quick sim bench setup
run:   ; python3 dev.py run
test:  ; python3 dev.py test
test-quick: ; python3 dev.py test --quick
sim:   ; python3 dev.py sim
bench: ; python3 dev.py bench
setup: ; python3 dev.py setup
