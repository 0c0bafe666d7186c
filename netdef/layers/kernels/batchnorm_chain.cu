// A BatchNorm chain on the GPU (CuPy RawKernel sources): BatchNorm, then in place Scale and/or ReLU,
// trained as one step (netdef/layers/batchnorm_chain.py; gpu_batchnorm_chain.py launches these).
// CPU twins: netdef/layers/jit/batchnorm_chain.py (forward_batch, backward), whose expressions each
// value here follows in the same order (compiled with --fmad=false, so no product is fused into a sum;
// CuPy adds -ftz=true, so float32 subnormals flush to zero here where the CPU keeps them).
//
// Layout: x, y, dy, dx are C-contiguous (N x C x M) (M: the spatial size); per-channel arrays have C
// values of type `real`. x is BatchNorm's input, y the chain's output (ReLU's top), dy its gradient,
// dx BatchNorm's input gradient.
//
// Forward (batch statistics): bn_statistics_partial sums each channel's values, shifted by the
// channel's first value, and their squares in double, one block per (channel, slice) of its N x M
// values; bn_statistics_finish adds a channel's slices in order (the same bits on every run), writes
// mean, var (biased), std and folds them into BatchNorm's moving sums; bn_chain_apply writes
// y = rectify(((x - mean) / std) * scale + bias). Backward: bn_gradient_partial sums, per channel, ReLU's
// input gradient r and r times the normalized value; bn_gradient_finish makes Scale's parameter
// sums and BatchNorm's two means; bn_gradient_apply writes dx. Three passes over the values forward
// (two reads of x, one write of y), two backward; the layers one by one make about twenty.
// channel_sum_partial and channel_sum_add, at the end, sum each channel of an array with the same
// block reduction (a convolution's bias gradient; gpu_batchnorm_chain.add_channel_sums).
//
// `real` is float or double (-Dreal=...). Block sizes are multiples of 32, at most 1024.

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

__device__ __forceinline__ double warp_sum(double v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

// a and b summed over the block, in a fixed order; thread 0 holds the totals.
__device__ void block_sums(double& a, double& b) {
  __shared__ double warp_a[32], warp_b[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  a = warp_sum(a);
  b = warp_sum(b);
  if (lane == 0) {
    warp_a[warp] = a;
    warp_b[warp] = b;
  }
  __syncthreads();
  if (warp == 0) {
    a = lane < warps ? warp_a[lane] : 0.0;
    b = lane < warps ? warp_b[lane] : 0.0;
    a = warp_sum(a);
    b = warp_sum(b);
  }
}

// Channel c's two sums from its slices' partial pairs, added in slice order (the same bits every run).
__device__ void slice_sums(const double* partial, int c, int slices, double& a, double& b) {
  a = 0.0;
  b = 0.0;
  for (int s = 0; s < slices; ++s) {
    a += partial[((long long)c * slices + s) * 2];
    b += partial[((long long)c * slices + s) * 2 + 1];
  }
}

// ReLU's forward as its kernel computes it: +0 where v <= 0 for slope 0, v * slope below 0 otherwise.
__device__ __forceinline__ real rectify(real v, real slope) {
  if (slope == (real)0) return v <= (real)0 ? (real)0 : v;
  return v > (real)0 ? v : v * slope;
}

// Grid (C, slices): partial[(c * slices + s) * 2 + {0, 1}] = the sums of (x - x[0, c, 0]) and of its
// square over slice s of channel c (values s * blockDim.x + thread, then every slices * blockDim.x).
extern "C" __global__ void bn_statistics_partial(const real* x, const int num, const int channels,
                                                 const int spatial, double* partial) {
  const int c = blockIdx.x, s = blockIdx.y, slices = gridDim.y;
  const long long count = (long long)num * spatial;
  const double shift = (double)x[(long long)c * spatial];
  double sum = 0.0, squares = 0.0;
  for (long long i = (long long)s * blockDim.x + threadIdx.x; i < count; i += (long long)slices * blockDim.x) {
    const long long n = i / spatial;
    const double v = (double)x[(n * channels + c) * spatial + (i - n * spatial)] - shift;
    sum += v;
    squares += v * v;
  }
  block_sums(sum, squares);
  if (threadIdx.x == 0) {
    partial[((long long)c * slices + s) * 2] = sum;
    partial[((long long)c * slices + s) * 2 + 1] = squares;
  }
}

// A thread per channel: mean, var (biased), std = sqrt(var + eps) from the partial sums, and
// BatchNorm's moving sums updated as its record_batch_statistics does: factor = maf * factor + 1,
// mean_sum = maf * mean_sum + mean, var_sum = maf * var_sum + correction * var.
extern "C" __global__ void bn_statistics_finish(const int channels, const int slices, const double* partial,
                                                const real* x, const int spatial, const double count,
                                                const real eps, const real maf, const real correction,
                                                real* mean, real* var, real* std, real* mean_sum,
                                                real* var_sum, real* factor) {
  KERNEL_LOOP(c, channels) {
    double sum, squares;
    slice_sums(partial, c, slices, sum, squares);
    const double offset = sum / count;
    double variance = squares / count - offset * offset;
    if (variance < 0.0) variance = 0.0;
    const real m = (real)((double)x[(long long)c * spatial] + offset);
    const real v = (real)variance;
    mean[c] = m;
    var[c] = v;
    std[c] = sqrt(v + eps);
    mean_sum[c] = mean_sum[c] * maf + m;
    var_sum[c] = var_sum[c] * maf + correction * v;
    if (c == 0) factor[0] = factor[0] * maf + (real)1;
  }
}

// One thread per value: y = rectify((((x + shift) - mean) / std) * scale + bias), each stage where asked
// for (shift: a convolution's bias, added before the maps of the layers in place after it).
extern "C" __global__ void bn_chain_apply(const int nthreads, const real* x, const int channels,
                                          const int spatial, const int has_shift, const real* shift,
                                          const real* mean, const real* std,
                                          const int has_scale, const real* scale, const int has_bias,
                                          const real* bias, const int has_relu, const real slope, real* y) {
  KERNEL_LOOP(i, nthreads) {
    const int c = (i / spatial) % channels;
    real v = x[i];
    if (has_shift) v = v + shift[c];
    v = (v - mean[c]) / std[c];
    if (has_scale) {
      v = v * scale[c];
      if (has_bias) v = v + bias[c];
    }
    if (has_relu) v = rectify(v, slope);
    y[i] = v;
  }
}

// ReLU's input gradient at one value: dy where y > 0, else dy * slope (dy itself without ReLU).
__device__ __forceinline__ real rectified_gradient(real g, real out, int has_relu, real slope) {
  if (!has_relu) return g;
  return out > (real)0 ? g : g * slope;
}

// Grid (C, slices): partial[(c * slices + s) * 2 + {0, 1}] = the sums of r and of r * (x - mean) / std
// over slice s of channel c, r being ReLU's input gradient (Scale's top gradient).
extern "C" __global__ void bn_gradient_partial(const real* x, const real* y, const real* dy, const int num,
                                               const int channels, const int spatial, const real* mean,
                                               const real* std, const int has_relu, const real slope,
                                               double* partial) {
  const int c = blockIdx.x, s = blockIdx.y, slices = gridDim.y;
  const long long count = (long long)num * spatial;
  const real center = mean[c], spread = std[c];
  double sum = 0.0, weighted = 0.0;
  for (long long i = (long long)s * blockDim.x + threadIdx.x; i < count; i += (long long)slices * blockDim.x) {
    const long long n = i / spatial;
    const long long k = (n * channels + c) * spatial + (i - n * spatial);
    const real r = rectified_gradient(dy[k], y[k], has_relu, slope);
    const real normalized = (x[k] - center) / spread;
    sum += (double)r;
    weighted += (double)r * (double)normalized;
  }
  block_sums(sum, weighted);
  if (threadIdx.x == 0) {
    partial[((long long)c * slices + s) * 2] = sum;
    partial[((long long)c * slices + s) * 2 + 1] = weighted;
  }
}

// A thread per channel: sums[c] and sums[C + c], Scale's parameter sums (of r, and of r times its
// input); with batch statistics, mean_g[c] and mean_yg[c], the means of BatchNorm's top gradient
// g = r * scale and of g times the normalized value, and inverse[c] = 1 / std[c].
extern "C" __global__ void bn_gradient_finish(const int channels, const int slices, const double* partial,
                                              const double count, const int has_scale, const real* scale,
                                              const int batch, const real* std, real* sums, real* mean_g,
                                              real* mean_yg, real* inverse) {
  KERNEL_LOOP(c, channels) {
    double sum, weighted;
    slice_sums(partial, c, slices, sum, weighted);
    sums[c] = (real)sum;
    sums[channels + c] = (real)weighted;
    if (batch) {
      const double factor = has_scale ? (double)scale[c] : 1.0;
      mean_g[c] = (real)(factor * sum / count);
      mean_yg[c] = (real)(factor * weighted / count);
      inverse[c] = (real)1 / std[c];
    }
  }
}

// One thread per value: dx = (g - mean_g - normalized * mean_yg) * inverse with batch statistics,
// g * inverse with global ones (inverse = 1 / std either way), g = r * scale (r without Scale).
extern "C" __global__ void bn_gradient_apply(const int nthreads, const real* x, const real* y, const real* dy,
                                             const int channels, const int spatial, const real* mean,
                                             const real* std, const int has_scale, const real* scale,
                                             const int has_relu, const real slope, const int batch,
                                             const real* mean_g, const real* mean_yg, const real* inverse,
                                             real* dx) {
  KERNEL_LOOP(i, nthreads) {
    const int c = (i / spatial) % channels;
    real g = rectified_gradient(dy[i], y[i], has_relu, slope);
    if (has_scale) g = g * scale[c];
    if (batch) {
      const real normalized = (x[i] - mean[c]) / std[c];
      dx[i] = (g - mean_g[c] - normalized * mean_yg[c]) * inverse[c];
    } else {
      dx[i] = g * inverse[c];
    }
  }
}

// The sum over samples and positions of each channel (a convolution's or Scale's bias gradient),
// with the chain's block reduction. Grid (C, slices): partial[c * slices + s] = the sum over slice s
// of channel c, in double.
extern "C" __global__ void channel_sum_partial(const real* x, const int num, const int channels,
                                               const int spatial, double* partial) {
  const int c = blockIdx.x, s = blockIdx.y, slices = gridDim.y;
  const long long count = (long long)num * spatial;
  double sum = 0.0, unused = 0.0;
  for (long long i = (long long)s * blockDim.x + threadIdx.x; i < count; i += (long long)slices * blockDim.x) {
    const long long n = i / spatial;
    sum += (double)x[(n * channels + c) * spatial + (i - n * spatial)];
  }
  block_sums(sum, unused);
  if (threadIdx.x == 0) partial[(long long)c * slices + s] = sum;
}

// A thread per channel: out[c] += the channel's sum (its slices added in order, then rounded).
extern "C" __global__ void channel_sum_add(const int channels, const int slices, const double* partial,
                                           real* out) {
  KERNEL_LOOP(c, channels) {
    double sum = 0.0;
    for (int s = 0; s < slices; ++s) sum += partial[(long long)c * slices + s];
    out[c] = out[c] + (real)sum;
  }
}
