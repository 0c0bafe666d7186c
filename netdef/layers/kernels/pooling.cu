// 2-D MAX and AVE pooling with Caffe's window rules (CuPy RawKernel sources).
// NumPy twins: netdef/layers/pool2d.py (max_pool_forward, max_pool_backward, ave_pool_forward,
// ave_pool_backward).
//
// Window of output (ph, pw): rows [ph*stride_h - pad_h, + kernel_h) clipped to the input.
// MAX: the first maximum in row-major order wins (strict >, starting from -FLT_MAX); mask holds its
// flat index h*W + w in the input plane (-1 when no cell beats -FLT_MAX).
// AVE: the divisor is the window clipped to the padded input [-pad, size + pad), the sum runs over
// real cells only.
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
// FLT_MAX written out exactly, so that the float and double builds start from the same value.
#define POOL_FLT_MAX 3.40282346638528859811704183484516925440e+38

extern "C" __global__ void max_pool_forward(const int nthreads, const real* bottom, const int channels,
                                            const int height, const int width, const int pooled_height,
                                            const int pooled_width, const int kernel_h, const int kernel_w,
                                            const int stride_h, const int stride_w, const int pad_h,
                                            const int pad_w, real* top, int* mask) {
  KERNEL_LOOP(index, nthreads) {
    const int pw = index % pooled_width;
    const int ph = (index / pooled_width) % pooled_height;
    const int nc = index / (pooled_width * pooled_height);
    int hstart = ph * stride_h - pad_h;
    int wstart = pw * stride_w - pad_w;
    const int hend = min(hstart + kernel_h, height);
    const int wend = min(wstart + kernel_w, width);
    hstart = max(hstart, 0);
    wstart = max(wstart, 0);
    real best = (real)(-POOL_FLT_MAX);
    int best_idx = -1;
    const real* plane = bottom + nc * height * width;
    for (int h = hstart; h < hend; ++h) {
      for (int w = wstart; w < wend; ++w) {
        if (plane[h * width + w] > best) {
          best_idx = h * width + w;
          best = plane[best_idx];
        }
      }
    }
    top[index] = best;
    mask[index] = best_idx;
  }
}

// One thread per input cell: the sum of the top diffs of the windows whose maximum it is.
extern "C" __global__ void max_pool_backward(const int nthreads, const real* top_diff, const int* mask,
                                             const int channels, const int height, const int width,
                                             const int pooled_height, const int pooled_width,
                                             const int kernel_h, const int kernel_w, const int stride_h,
                                             const int stride_w, const int pad_h, const int pad_w,
                                             real* bottom_diff) {
  KERNEL_LOOP(index, nthreads) {
    const int w = index % width;
    const int h = (index / width) % height;
    const int nc = index / (width * height);
    const int phstart = (h + pad_h < kernel_h) ? 0 : (h + pad_h - kernel_h) / stride_h + 1;
    const int phend = min((h + pad_h) / stride_h + 1, pooled_height);
    const int pwstart = (w + pad_w < kernel_w) ? 0 : (w + pad_w - kernel_w) / stride_w + 1;
    const int pwend = min((w + pad_w) / stride_w + 1, pooled_width);
    const int offset = nc * pooled_height * pooled_width;
    real gradient = 0;
    for (int ph = phstart; ph < phend; ++ph) {
      for (int pw = pwstart; pw < pwend; ++pw) {
        if (mask[offset + ph * pooled_width + pw] == h * width + w) {
          gradient += top_diff[offset + ph * pooled_width + pw];
        }
      }
    }
    bottom_diff[index] = gradient;
  }
}

extern "C" __global__ void ave_pool_forward(const int nthreads, const real* bottom, const int channels,
                                            const int height, const int width, const int pooled_height,
                                            const int pooled_width, const int kernel_h, const int kernel_w,
                                            const int stride_h, const int stride_w, const int pad_h,
                                            const int pad_w, real* top) {
  KERNEL_LOOP(index, nthreads) {
    const int pw = index % pooled_width;
    const int ph = (index / pooled_width) % pooled_height;
    const int nc = index / (pooled_width * pooled_height);
    int hstart = ph * stride_h - pad_h;
    int wstart = pw * stride_w - pad_w;
    int hend = min(hstart + kernel_h, height + pad_h);
    int wend = min(wstart + kernel_w, width + pad_w);
    const int pool_size = (hend - hstart) * (wend - wstart);
    hstart = max(hstart, 0);
    wstart = max(wstart, 0);
    hend = min(hend, height);
    wend = min(wend, width);
    real sum = 0;
    const real* plane = bottom + nc * height * width;
    for (int h = hstart; h < hend; ++h) {
      for (int w = wstart; w < wend; ++w) {
        sum += plane[h * width + w];
      }
    }
    top[index] = sum / pool_size;
  }
}

// One thread per input cell: the sum over the windows containing it of top_diff / divisor.
extern "C" __global__ void ave_pool_backward(const int nthreads, const real* top_diff, const int channels,
                                             const int height, const int width, const int pooled_height,
                                             const int pooled_width, const int kernel_h, const int kernel_w,
                                             const int stride_h, const int stride_w, const int pad_h,
                                             const int pad_w, real* bottom_diff) {
  KERNEL_LOOP(index, nthreads) {
    const int w = index % width + pad_w;
    const int h = (index / width) % height + pad_h;
    const int nc = index / (width * height);
    const int phstart = (h < kernel_h) ? 0 : (h - kernel_h) / stride_h + 1;
    const int phend = min(h / stride_h + 1, pooled_height);
    const int pwstart = (w < kernel_w) ? 0 : (w - kernel_w) / stride_w + 1;
    const int pwend = min(w / stride_w + 1, pooled_width);
    const real* diff = top_diff + nc * pooled_height * pooled_width;
    real gradient = 0;
    for (int ph = phstart; ph < phend; ++ph) {
      for (int pw = pwstart; pw < pwend; ++pw) {
        const int hstart = ph * stride_h - pad_h;
        const int wstart = pw * stride_w - pad_w;
        const int hend = min(hstart + kernel_h, height + pad_h);
        const int wend = min(wstart + kernel_w, width + pad_w);
        const int pool_size = (hend - hstart) * (wend - wstart);
        gradient += diff[ph * pooled_width + pw] / pool_size;
      }
    }
    bottom_diff[index] = gradient;
  }
}
