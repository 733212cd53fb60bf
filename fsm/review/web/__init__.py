"""The review page: a local web server over a folder of journals (`python -m fsm review DIR`)."""
