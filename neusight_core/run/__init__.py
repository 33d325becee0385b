"""The run: the notebooks executed in order by ./run_all.sh (papermill and its kernels), their record, SUMMARY.md and
the tarball to send back, and the time a run is expected to take."""
