// ReLU on the GPU (CuPy RawKernel sources), one pass each way with no temporaries (CuPy's maximum
// and where took three kernels and two temporaries backward). NumPy twins: netdef/layers/jit/
// elementwise.py (relu_forward, relu_backward), whose expressions these follow.
// `real` is float or double (-Dreal=...); arrays are C-contiguous and of the same size.

#ifndef real
#define real float
#endif
#ifndef KERNEL_LOOP
// A grid-stride loop whose index never passes n, so that it cannot wrap for a count near 2^31 - 1
// (the launcher refuses larger counts).
#define KERNEL_LOOP(i, n) \
  for (int i = blockIdx.x * blockDim.x + threadIdx.x, netdef_step_ = blockDim.x * gridDim.x; i < (n); \
       i = ((n) - i > netdef_step_) ? i + netdef_step_ : (n))
#endif

// y = x where x > 0, else x * slope; for slope 0, +0 where x <= 0 (a NaN stays NaN).
extern "C" __global__ void relu_forward(const int nthreads, const real* x, const real slope, real* y) {
  KERNEL_LOOP(i, nthreads) {
    const real v = x[i];
    if (slope == (real)0) {
      y[i] = v <= (real)0 ? (real)0 : v;
    } else {
      y[i] = v > (real)0 ? v : v * slope;
    }
  }
}

// dx = dy where x > 0, else dy * slope (dx may be dy).
extern "C" __global__ void relu_backward(const int nthreads, const real* x, const real* dy, const real slope,
                                         real* dx) {
  KERNEL_LOOP(i, nthreads) {
    const real g = dy[i];
    dx[i] = x[i] > (real)0 ? g : g * slope;
  }
}
