"""The CPU emulation harness: CUDA's execution model on one CPU thread, so that the kernels of
minipaged/cuda/ compile with g++ and run (and are tested) on a machine without a GPU.

A tool that runs the lesson, not the lesson: cuda_emu.h (threads as fibers, barriers, shuffles,
shared memory, and the bugs it reports instead of hanging), emu_fibers.h (the fiber runtime),
emu_half.h (a software __half), broken_kernels.cu (one bug per kernel, for the tests and lesson
08), wrappers.py (the generated C entry points ctypes calls), cpu_build.py (the g++ build
driver and the ctypes loader).
"""
