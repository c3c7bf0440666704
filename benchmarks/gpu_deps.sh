# Sourced by every gpu_*.sh that trains (through gpu_common.sh or directly): genlab writes each run's config as TOML
# (tomli_w), which the GPU image lacks; install it from the carried wheels (WHEELS, default wheels/).
python3 -c "import tomli_w" 2>/dev/null || python3 -m pip install --quiet --no-deps ${WHEELS:-wheels}/tomli_w-*.whl 2>&1 | tail -1
