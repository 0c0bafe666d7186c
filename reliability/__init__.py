"""Reliability proofs kept with the project: kill tests, a soak run and their report (REPORT.md)."""
