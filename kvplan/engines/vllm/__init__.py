"""vLLM (v1, releases up to 0.33.0), split as vLLM's own source splits it; `engine.py` says what each module holds.
The registry (`kvplan.engines`) loads `engine.Vllm`, and the names callers use, from the modules that hold them."""
