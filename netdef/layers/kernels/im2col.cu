// im2col / col2im for 2-D convolution over a whole batch (CuPy RawKernel sources).
// NumPy twins: netdef/layers/im2col.py (im2col, col2im).
//
// Column layout (C-ordered): (C, KH, KW, N, HO, WO), i.e. a (C*KH*KW) x (N*HO*WO) matrix whose rows
// follow Caffe's order, so that W (num_output x C*KH*KW) times it is the convolution of the batch.
// `real` is float or double (set with -Dreal=...). Every kernel takes the work-item count first and
// runs a grid-stride loop, so any launch size is correct.

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

// One thread per column entry: col[c, i, j, n, ho, wo] = padded im[n, c, ho*sh - ph + i*dh, wo*sw - pw + j*dw].
extern "C" __global__ void im2col(const int nthreads, const real* im, const int num, const int channels,
                                  const int height, const int width, const int kernel_h, const int kernel_w,
                                  const int pad_h, const int pad_w, const int stride_h, const int stride_w,
                                  const int dilation_h, const int dilation_w, const int height_col,
                                  const int width_col, real* col) {
  KERNEL_LOOP(index, nthreads) {
    int t = index;
    const int wo = t % width_col;
    t /= width_col;
    const int ho = t % height_col;
    t /= height_col;
    const int n = t % num;
    t /= num;
    const int j = t % kernel_w;
    t /= kernel_w;
    const int i = t % kernel_h;
    const int c = t / kernel_h;
    const int h = ho * stride_h - pad_h + i * dilation_h;
    const int w = wo * stride_w - pad_w + j * dilation_w;
    col[index] = (h >= 0 && h < height && w >= 0 && w < width)
                     ? im[((n * channels + c) * height + h) * width + w]
                     : (real)0;
  }
}

// One thread per image cell (gather, no atomics): im[n, c, h, w] = sum of the column entries read from it.
extern "C" __global__ void col2im(const int nthreads, const real* col, const int num, const int channels,
                                  const int height, const int width, const int kernel_h, const int kernel_w,
                                  const int pad_h, const int pad_w, const int stride_h, const int stride_w,
                                  const int dilation_h, const int dilation_w, const int height_col,
                                  const int width_col, real* im) {
  KERNEL_LOOP(index, nthreads) {
    const int w = index % width;
    const int h = (index / width) % height;
    const int c = (index / (width * height)) % channels;
    const int n = index / (width * height * channels);
    real val = 0;
    for (int i = 0; i < kernel_h; ++i) {
      const int hh = h + pad_h - i * dilation_h;
      if (hh < 0 || hh % stride_h != 0) continue;
      const int ho = hh / stride_h;
      if (ho >= height_col) continue;
      for (int j = 0; j < kernel_w; ++j) {
        const int ww = w + pad_w - j * dilation_w;
        if (ww < 0 || ww % stride_w != 0) continue;
        const int wo = ww / stride_w;
        if (wo >= width_col) continue;
        val += col[((((c * kernel_h + i) * kernel_w + j) * num + n) * height_col + ho) * width_col + wo];
      }
    }
    im[index] = val;
  }
}
