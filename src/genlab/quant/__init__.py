"""Post-training quantization of trained runs (`genlab quantize`): weight formats (ptq.py), the quantized run
folder that sample/eval load (run.py), and the quantization gap against training length (gap.py)."""
