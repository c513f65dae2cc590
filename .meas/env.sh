export TFCLUSTER_STORE_PORT=9611
export PYTHONPATH=/work/wt-image/train:/work/wt-image
export PATH=/work/main/.venv/bin:$PATH
