"""The atheris harnesses and their tools are scripts, not tests: pytest leaves them alone
(CI does not install atheris; the property tests live in tests/test_fuzz_*.py)."""

collect_ignore_glob = ["fuzz_*.py", "atheris_main.py", "campaign.py", "make_corpus.py"]
