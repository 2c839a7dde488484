"""What needs a CUDA GPU (``run_gpu.sh`` runs it in one go), and the kernels' PTX, compiled without one."""
