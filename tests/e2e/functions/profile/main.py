"""End-to-end test function: reads the size and compute profile its job resolved to."""

from qiskit_serverless import get_compute_profile, get_function_size, save_result

save_result({"profile": get_compute_profile(), "size": get_function_size()})
