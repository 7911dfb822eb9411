# One entry point for lint and one for tests; CI runs `make test` through .ci/run.
.PHONY: lint test test-rust test-python fmt

lint:
	cargo fmt --all --check
	cargo clippy --workspace --all-targets --all-features -- -D warnings
	ruff check .
	ruff format --check .
	mypy

fmt:
	cargo fmt --all
	ruff format .
	ruff check --fix .

# flint_py is a cdylib extension module: it is tested from Python (pytest), not by cargo.
test-rust:
	cargo test --workspace --exclude flint_py

test-python:
	python -m pytest

test: test-rust test-python
