"""The data tools of ``netdef <verb>``: ``convert-mnist``, ``convert-imageset``, ``compute-image-mean``,
``prepare-digits`` and ``download-mnist`` (Caffe's tools of the same names, and two for a first run)."""
from __future__ import annotations

import logging

from .common import caffe_flag, positive_int

log = logging.getLogger("netdef")


def add_parsers(verbs, common) -> None:
    mnist = verbs.add_parser("convert-mnist", parents=[common],
                             help="IDX image and label files (gzipped or not) to a DB of Datums")
    mnist.add_argument("images")
    mnist.add_argument("labels")
    mnist.add_argument("output_db")
    caffe_flag(mnist, "backend", default="lmdb", choices=["lmdb", "leveldb"], help="the DB type")
    mnist.set_defaults(func=cmd_convert_mnist)

    imageset = verbs.add_parser("convert-imageset", parents=[common],
                                help="a list of images ('path label' lines) to a DB of Datums")
    imageset.add_argument("root_folder")
    imageset.add_argument("listfile")
    imageset.add_argument("db_name")
    caffe_flag(imageset, "resize_height", type=int, default=0, help="resize images to this height (0: keep)")
    caffe_flag(imageset, "resize_width", type=int, default=0, help="resize images to this width (0: keep)")
    caffe_flag(imageset, "shuffle", action="store_true", help="shuffle the list order")
    caffe_flag(imageset, "gray", action="store_true", help="load images as grayscale")
    caffe_flag(imageset, "encoded", action="store_true", help="store encoded images (PNG/JPEG bytes)")
    caffe_flag(imageset, "encode_type", default="", help="encoding to store: png or jpg (default: the file's own)")
    caffe_flag(imageset, "backend", default="lmdb", choices=["lmdb", "leveldb"], help="the DB type")
    caffe_flag(imageset, "check_size", action="store_true", help="check that all images have the same size")
    caffe_flag(imageset, "threads", type=positive_int, default=None,
               help="threads that read and encode images (netdef's; default: NETDEF_DATA_THREADS, else every core)")
    imageset.set_defaults(func=cmd_convert_imageset)

    mean = verbs.add_parser("compute-image-mean", parents=[common],
                            help="the mean image of a DB, as a .binaryproto")
    mean.add_argument("input_db")
    mean.add_argument("output_file")
    caffe_flag(mean, "backend", default="lmdb", choices=["lmdb", "leveldb"], help="the DB type")
    mean.set_defaults(func=cmd_compute_image_mean)

    digits = verbs.add_parser("prepare-digits", parents=[common],
                              help="write scikit-learn's bundled 8x8 digits as IDX files and "
                                    "LMDBs (offline data for a first run)")
    digits.add_argument("folder")
    digits.set_defaults(func=cmd_prepare_digits)

    download = verbs.add_parser("download-mnist", parents=[common],
                                help="download the four MNIST files (needs the internet)")
    download.add_argument("folder")
    caffe_flag(download, "url", default="", help="base address of a mirror holding the four .gz files")
    download.set_defaults(func=cmd_download_mnist)


def cmd_convert_mnist(args) -> int:
    from netdef.data.convert import convert_mnist

    count = convert_mnist(args.images, args.labels, args.output_db, backend=args.backend)
    log.info("Processed %s files.", count)
    return 0


def cmd_convert_imageset(args) -> int:
    from netdef.data.convert import convert_imageset

    count = convert_imageset(args.root_folder, args.listfile, args.db_name, resize_height=args.resize_height,
                             resize_width=args.resize_width, shuffle=args.shuffle, gray=args.gray,
                             encoded=args.encoded, encode_type=args.encode_type, backend=args.backend,
                             check_size=args.check_size, threads=args.threads)
    log.info("Processed %s files.", count)
    return 0


def cmd_compute_image_mean(args) -> int:
    from netdef.data.convert import compute_image_mean

    compute_image_mean(args.input_db, args.output_file, backend=args.backend)
    return 0


def cmd_prepare_digits(args) -> int:
    import pathlib

    from netdef.data.convert import convert_mnist, digits_to_idx

    folder = pathlib.Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    train_images, train_labels, test_images, test_labels = digits_to_idx(folder)
    for split, images, labels in (("train", train_images, train_labels), ("test", test_images, test_labels)):
        db = folder / f"digits_{split}_lmdb"
        if db.exists():
            log.info("%s exists; keeping it", db)
            continue
        count = convert_mnist(images, labels, str(db), backend="lmdb")
        log.info("Wrote %s (%s images)", db, count)
    return 0


def cmd_download_mnist(args) -> int:
    from netdef.data.convert import MNIST_URL, download_mnist

    paths = download_mnist(args.folder, base_url=args.url or MNIST_URL)
    for path in paths:
        log.info("%s", path)
    return 0
