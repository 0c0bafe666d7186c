// LRN across channels (CuPy RawKernel sources). NumPy twins: netdef/layers/lrn.py
// (lrn_across_forward, lrn_across_backward).
//
// scale[n, c, h, w] = k + alpha / size * sum of x^2 over channels [c - (size-1)/2, c + (size-1)/2]
// (zero outside); y = x * scale^-beta;
// dx = dy * scale^-beta - 2 * alpha * beta / size * x * (same channel-window sum of dy * y / scale).
// `real` is float or double (-Dreal=...); arrays are C-contiguous (N, C, H, W).

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

// One thread per (n, h, w): a running window sum down the channels.
extern "C" __global__ void lrn_fill_scale(const int nthreads, const real* in, const int channels,
                                          const int height, const int width, const int size,
                                          const real alpha_over_size, const real k, real* scale) {
  KERNEL_LOOP(index, nthreads) {
    const int w = index % width;
    const int h = (index / width) % height;
    const int n = index / (width * height);
    const int step = height * width;
    const int offset = n * channels * step + h * width + w;
    const real* x = in + offset;
    real* s = scale + offset;
    const int pre_pad = (size - 1) / 2;
    const int post_pad = size - pre_pad - 1;
    real accum = 0;
    int head = 0;
    // Fill the window up to the first channel's right end.
    while (head < post_pad && head < channels) {
      accum += x[head * step] * x[head * step];
      ++head;
    }
    while (head < channels) {
      accum += x[head * step] * x[head * step];
      if (head - size >= 0) accum -= x[(head - size) * step] * x[(head - size) * step];
      s[(head - post_pad) * step] = k + accum * alpha_over_size;
      ++head;
    }
    // The windows' right ends past the last channel; with fewer channels than post_pad, the first of
    // them still belong to no channel (Caffe's kernel writes those before the array).
    while (head < channels + post_pad) {
      if (head - size >= 0) accum -= x[(head - size) * step] * x[(head - size) * step];
      if (head >= post_pad) s[(head - post_pad) * step] = k + accum * alpha_over_size;
      ++head;
    }
  }
}

extern "C" __global__ void lrn_compute_output(const int nthreads, const real* in, const real* scale,
                                              const real negative_beta, real* out) {
  KERNEL_LOOP(index, nthreads) {
    out[index] = in[index] * pow(scale[index], negative_beta);
  }
}

// One thread per (n, h, w); cache_ratio = 2 * alpha * beta / size.
extern "C" __global__ void lrn_compute_diff(const int nthreads, const real* bottom_data, const real* top_data,
                                            const real* scale, const real* top_diff, const int channels,
                                            const int height, const int width, const int size,
                                            const real negative_beta, const real cache_ratio,
                                            real* bottom_diff) {
  KERNEL_LOOP(index, nthreads) {
    const int w = index % width;
    const int h = (index / width) % height;
    const int n = index / (width * height);
    const int step = height * width;
    const int offset = n * channels * step + h * width + w;
    const real* x = bottom_data + offset;
    const real* y = top_data + offset;
    const real* s = scale + offset;
    const real* dy = top_diff + offset;
    real* dx = bottom_diff + offset;
    const int pre_pad = (size - 1) / 2;
    const int post_pad = size - pre_pad - 1;
    real accum = 0;
    int head = 0;
    while (head < post_pad && head < channels) {
      accum += dy[head * step] * y[head * step] / s[head * step];
      ++head;
    }
    while (head < channels) {
      accum += dy[head * step] * y[head * step] / s[head * step];
      if (head - size >= 0) accum -= dy[(head - size) * step] * y[(head - size) * step] / s[(head - size) * step];
      const int c = head - post_pad;
      dx[c * step] = dy[c * step] * pow(s[c * step], negative_beta) - cache_ratio * x[c * step] * accum;
      ++head;
    }
    while (head < channels + post_pad) {  // as in lrn_fill_scale: no channel before the first
      if (head - size >= 0) accum -= dy[(head - size) * step] * y[(head - size) * step] / s[(head - size) * step];
      const int c = head - post_pad;
      if (c >= 0) dx[c * step] = dy[c * step] * pow(s[c * step], negative_beta) - cache_ratio * x[c * step] * accum;
      ++head;
    }
  }
}
