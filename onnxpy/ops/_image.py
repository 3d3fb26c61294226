"""Image decoders in pure Python + numpy for ImageDecoder: PNG, BMP, PNM/PAM, TIFF and JPEG
(baseline and progressive Huffman).

``decode_image(data, max_bytes)`` returns a (H, W, C) uint8 array with C = 1 (grayscale) or 3
(RGB); alpha channels are dropped. Formats it cannot decode raise ``UnsupportedImage`` naming
the format; malformed streams raise ``ValueError``.

Streams come from strangers: the size a header claims is checked against ``max_bytes`` before
anything of that size is allocated (``MemoryError``), decompression stops at the size the
header needs (no zip bombs), and entropy decoding stops where the data end.
"""

from __future__ import annotations

import re
import struct
import zlib

import numpy as np


class UnsupportedImage(ValueError):
    """The stream is an image format (or variant) this decoder does not implement."""


def sniff(data: bytes) -> str:
    """The container format named by the stream's magic bytes."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "PNG"
    if data.startswith(b"\xff\xd8"):
        return "JPEG"
    if data.startswith(b"BM"):
        return "BMP"
    if len(data) >= 2 and data[0:1] == b"P" and data[1:2] in b"1234567":
        return "PNM"
    if data.startswith((b"II*\x00", b"MM\x00*")):
        return "TIFF"
    if data.startswith((b"II+\x00", b"MM\x00+")):
        return "BigTIFF"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WebP"
    if data.startswith(b"\x00\x00\x00\x0cjP  \r\n\x87\n") or data.startswith(b"\xff\x4f\xff\x51"):
        return "JPEG 2000"
    if data.startswith((b"GIF87a", b"GIF89a")):
        return "GIF"
    return "unknown"


def _check_size(fmt: str, width: int, height: int, channels: int, itemsize: int, max_bytes: int | None) -> None:
    """Refuse a header's claimed size before allocating it."""
    if width <= 0 or height <= 0 or channels <= 0:
        raise ValueError(f"corrupt {fmt} stream: {width}x{height} pixels, {channels} channels")
    nbytes = width * height * channels * itemsize
    if max_bytes is not None and nbytes > max_bytes:
        raise MemoryError(
            f"a {width}x{height} {fmt} image of {channels} channels needs {nbytes} bytes to decode, over the "
            f"session's allocation budget of {max_bytes} bytes (session config 'session.max_allocation_bytes')"
        )


def _inflate(data: bytes, limit: int) -> bytes:
    """zlib data decompressed to at most ``limit`` bytes (what the header says is needed)."""
    d = zlib.decompressobj()
    return d.decompress(data, max(limit, 1))


def decode_image(data: bytes, max_bytes: int | None = None) -> np.ndarray:
    fmt = sniff(data)
    decoder = {"PNG": _decode_png, "JPEG": _decode_jpeg, "BMP": _decode_bmp, "PNM": _decode_pnm, "TIFF": _decode_tiff}
    if fmt not in decoder:
        if fmt == "unknown":
            raise UnsupportedImage(f"unrecognized image format (first bytes {data[:8]!r})")
        raise UnsupportedImage(
            f"{fmt} images are not supported by onnxpy's ImageDecoder (supported: PNG, JPEG, BMP, PNM/PAM, TIFF)"
        )
    try:
        img = decoder[fmt](data, max_bytes)
    except (UnsupportedImage, ValueError):
        raise
    except (IndexError, KeyError, struct.error, zlib.error, OverflowError) as e:
        raise ValueError(f"corrupt {fmt} stream: {type(e).__name__}: {e}") from e
    if img.ndim == 2:
        img = img[:, :, None]
    if img.shape[2] in (2, 4):  # drop alpha
        img = img[:, :, :-1]
    return np.ascontiguousarray(img.astype(np.uint8, copy=False))


def to_gray(rgb: np.ndarray) -> np.ndarray:
    """ITU-R 601-2 luma in 16-bit fixed point, rounded: L = 0.299 R + 0.587 G + 0.114 B."""
    v = rgb.astype(np.uint32)
    y = (v[..., 0] * 19595 + v[..., 1] * 38470 + v[..., 2] * 7471 + 0x8000) >> 16
    return y.astype(np.uint8)[..., None]


def _scale_to_8bit(v: np.ndarray, bits: int) -> np.ndarray:
    if bits == 8:
        return v.astype(np.uint8)
    if bits == 16:
        return (v >> 8).astype(np.uint8)
    top = (1 << bits) - 1
    return (v.astype(np.uint32) * 255 // top).astype(np.uint8)


def _unpack_bits(rows: np.ndarray, bits: int, count: int) -> np.ndarray:
    """(H, row_bytes) uint8 packed MSB-first samples of ``bits`` bits -> (H, count) values."""
    if bits == 8:
        return rows[:, :count]
    if bits == 16:
        return (rows[:, 0 : 2 * count : 2].astype(np.uint16) << 8) | rows[:, 1 : 2 * count : 2]
    b = np.unpackbits(rows, axis=1)
    per = b.shape[1] // bits
    b = b[:, : per * bits].reshape(rows.shape[0], per, bits)
    weights = (1 << np.arange(bits - 1, -1, -1)).astype(np.uint8)
    return (b * weights).sum(axis=2, dtype=np.uint16)[:, :count]


# -- PNG ------------------------------------------------------------------------------------------


def _png_unfilter(raw: np.ndarray, height: int, row_bytes: int, bpp: int) -> np.ndarray:
    """Undo PNG's per-row filters. Each pixel depends on its left, upper and upper-left
    neighbours, so pixels on one anti-diagonal are independent: one vector step per diagonal."""
    rows = raw.reshape(height, row_bytes + 1)
    ftype = rows[:, 0].astype(np.int16)
    if ftype.max(initial=0) > 4:
        raise ValueError(f"corrupt PNG stream: unknown row filter type {int(ftype.max())}")
    data = rows[:, 1:].astype(np.int16)
    if not ftype.any():
        return data.astype(np.uint8)
    units = row_bytes // bpp
    data = data.reshape(height, units, bpp)
    if np.all((ftype == 0) | (ftype == 2)):
        # None / Up only: a running sum down each column, restarted at None rows.
        out = np.empty_like(data)
        prev = np.zeros((units, bpp), dtype=np.int16)
        for r in range(height):
            prev = (data[r] + prev) & 255 if ftype[r] == 2 else data[r]
            out[r] = prev
        return out.reshape(height, row_bytes).astype(np.uint8)
    out = np.zeros((height + 1, units + 1, bpp), dtype=np.int16)
    for d in range(height + units - 1):
        r = np.arange(max(0, d - units + 1), min(height - 1, d) + 1)
        u = d - r
        a = out[r + 1, u]
        b = out[r, u + 1]
        c = out[r, u]
        f = ftype[r][:, None]
        p = a + b - c
        pa, pb, pc = np.abs(p - a), np.abs(p - b), np.abs(p - c)
        paeth = np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))
        pred = np.select([f == 1, f == 2, f == 3, f == 4], [a, b, (a + b) >> 1, paeth], 0)
        out[r + 1, u + 1] = (data[r, u] + pred) & 255
    return out[1:, 1:].reshape(height, row_bytes).astype(np.uint8)


_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


def _decode_png(data: bytes, max_bytes: int | None) -> np.ndarray:
    pos = 8
    ihdr = None
    palette = None
    idat = []
    while pos + 8 <= len(data):
        length, ctype = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if ctype == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body[:13])
        elif ctype == b"PLTE":
            palette = np.frombuffer(body, dtype=np.uint8).reshape(-1, 3)
        elif ctype == b"IDAT":
            idat.append(body)
        elif ctype == b"IEND":
            break
    if ihdr is None:
        raise ValueError("corrupt PNG stream: no IHDR chunk")
    width, height, depth, color, _, _, interlace = ihdr
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}.get(color)
    if channels is None or depth not in (1, 2, 4, 8, 16):
        raise ValueError(f"corrupt PNG stream: color type {color} with bit depth {depth}")
    _check_size("PNG", width, height, channels, 2 if depth == 16 else 1, max_bytes)
    if interlace == 0:
        total = height * ((width * channels * depth + 7) // 8 + 1)
    else:
        total = 0
        for x0, y0, dx, dy in _ADAM7:
            w = (width - x0 + dx - 1) // dx if width > x0 else 0
            h = (height - y0 + dy - 1) // dy if height > y0 else 0
            if w and h:
                total += h * ((w * channels * depth + 7) // 8 + 1)
    raw = np.frombuffer(_inflate(b"".join(idat), total), dtype=np.uint8)
    bpp = max(1, channels * depth // 8)

    def decode_pass(buf: np.ndarray, w: int, h: int) -> np.ndarray:
        row_bytes = (w * channels * depth + 7) // 8
        rows = _png_unfilter(buf, h, row_bytes, bpp)
        return _unpack_bits(rows, depth, w * channels).reshape(h, w, channels)

    if interlace == 0:
        need = height * ((width * channels * depth + 7) // 8 + 1)
        if raw.size < need:
            raise ValueError(f"corrupt PNG stream: {raw.size} bytes of image data, expected {need}")
        img = decode_pass(raw[:need], width, height)
    else:
        img = np.zeros((height, width, channels), dtype=np.uint16 if depth == 16 else np.uint8)
        off = 0
        for x0, y0, dx, dy in _ADAM7:
            w = (width - x0 + dx - 1) // dx if width > x0 else 0
            h = (height - y0 + dy - 1) // dy if height > y0 else 0
            if w == 0 or h == 0:
                continue
            size = h * ((w * channels * depth + 7) // 8 + 1)
            img[y0::dy, x0::dx] = decode_pass(raw[off : off + size], w, h)
            off += size
    if color == 3:
        if palette is None:
            raise ValueError("corrupt PNG stream: palette image without PLTE chunk")
        return palette[np.minimum(img[:, :, 0], len(palette) - 1)]
    out = _scale_to_8bit(img, depth)
    if color in (0, 4):
        return out[:, :, :1]
    return out[:, :, :3]


# -- BMP ------------------------------------------------------------------------------------------


def _bitfield(values: np.ndarray, mask: int) -> np.ndarray:
    if mask == 0:
        return np.zeros(values.shape, dtype=np.uint8)
    shift = (mask & -mask).bit_length() - 1
    top = mask >> shift
    return ((values & mask) >> shift).astype(np.uint32) * 255 // top


def _bmp_rle(data: bytes, width: int, height: int, four: bool) -> np.ndarray:
    """Run-length encoded 8- or 4-bit BMP to palette indices, bottom-up rows."""
    out = np.zeros((height, width), dtype=np.uint8)
    x = y = 0
    i = 0
    while i + 1 < len(data) and y < height:
        n, v = data[i], data[i + 1]
        i += 2
        if n:
            vals = [v >> 4, v & 15] * ((n + 1) // 2) if four else [v] * n
            vals = vals[:n][: max(0, width - x)]
            out[y, x : x + len(vals)] = vals
            x += n
        elif v == 0:
            x, y = 0, y + 1
        elif v == 1:
            break
        elif v == 2:
            x += data[i]
            y += data[i + 1]
            i += 2
        else:
            nbytes = (v + 1) // 2 if four else v
            chunk = data[i : i + nbytes]
            vals = [c for b in chunk for c in (b >> 4, b & 15)][:v] if four else list(chunk)
            vals = vals[: max(0, width - x)]
            out[y, x : x + len(vals)] = vals
            x += v
            i += nbytes + (nbytes & 1)
    return out


def _decode_bmp(data: bytes, max_bytes: int | None) -> np.ndarray:
    offset = struct.unpack("<I", data[10:14])[0]
    hsize = struct.unpack("<I", data[14:18])[0]
    if hsize == 12:
        width, height, _, bits = struct.unpack("<HHHH", data[18:26])
        compression, colors = 0, 0
        pal_entry = 3
    elif hsize >= 40:
        width, height, _, bits, compression = struct.unpack("<iiHHI", data[18:34])
        colors = struct.unpack("<I", data[46:50])[0]
        pal_entry = 4
    else:
        raise ValueError(f"corrupt BMP stream: header size {hsize}")
    top_down = height < 0
    height = abs(height)
    if width <= 0:
        raise ValueError(f"corrupt BMP stream: width {width}")
    _check_size("BMP", width, height, 4, 1, max_bytes)
    masks = None
    if compression in (3, 6):  # BI_BITFIELDS / BI_ALPHABITFIELDS
        if hsize >= 52:
            masks = struct.unpack("<III", data[54:66])
        else:
            masks = struct.unpack("<III", data[14 + hsize : 14 + hsize + 12])
    elif compression not in (0, 1, 2):
        kind = {4: "embedded JPEG", 5: "embedded PNG"}.get(compression, f"compression {compression}")
        raise UnsupportedImage(f"BMP with {kind} is not supported")
    palette = None
    if bits <= 8:
        n = colors or (1 << bits)
        start = 14 + hsize + (12 if compression == 3 and hsize == 40 else 0)
        pal = np.frombuffer(data[start : start + n * pal_entry], dtype=np.uint8).reshape(-1, pal_entry)
        palette = pal[:, 2::-1]  # BGR(A) -> RGB
    pixels = data[offset:]
    if compression in (1, 2):
        idx = _bmp_rle(pixels, width, height, four=compression == 2)
        img = palette[np.minimum(idx, len(palette) - 1)]
        return img if top_down else img[::-1]
    stride = ((width * bits + 31) // 32) * 4
    rows = np.frombuffer(pixels[: stride * height], dtype=np.uint8)
    if rows.size < stride * height:
        raise ValueError(f"corrupt BMP stream: {rows.size} pixel bytes, expected {stride * height}")
    rows = rows.reshape(height, stride)
    if bits <= 8:
        assert palette is not None
        idx = _unpack_bits(rows, bits, width)
        img = palette[np.minimum(idx, len(palette) - 1)]
    elif bits == 24:
        img = rows[:, : width * 3].reshape(height, width, 3)[:, :, ::-1]
    elif bits in (16, 32):
        dt = "<u2" if bits == 16 else "<u4"
        vals = rows[:, : width * bits // 8].copy().view(dt).astype(np.uint32)
        if masks is None:
            masks = (0x7C00, 0x03E0, 0x001F) if bits == 16 else (0xFF0000, 0x00FF00, 0x0000FF)
        img = np.stack([_bitfield(vals, m) for m in masks], axis=-1).astype(np.uint8)
    else:
        raise UnsupportedImage(f"BMP with {bits} bits per pixel is not supported")
    return img if top_down else img[::-1]


# -- PNM / PAM ------------------------------------------------------------------------------------


def _pnm_tokens(data: bytes, count: int, pos: int) -> tuple[list[bytes], int]:
    """``count`` whitespace-separated header tokens from ``pos`` ('#' starts a comment)."""
    out: list[bytes] = []
    n = len(data)
    while len(out) < count:
        while pos < n and data[pos : pos + 1].isspace():
            pos += 1
        if pos < n and data[pos : pos + 1] == b"#":
            while pos < n and data[pos : pos + 1] not in (b"\n", b"\r"):
                pos += 1
            continue
        start = pos
        while pos < n and not data[pos : pos + 1].isspace() and data[pos : pos + 1] != b"#":
            pos += 1
        if start == pos:
            raise ValueError("corrupt PNM stream: truncated header")
        out.append(data[start:pos])
    return out, pos


def _decode_pnm(data: bytes, max_bytes: int | None) -> np.ndarray:
    kind = data[1:2]
    if kind == b"7":
        return _decode_pam(data, max_bytes)
    if kind in (b"1", b"4"):
        (w, h), pos = _pnm_tokens(data, 2, 2)
        width, height, maxval = int(w), int(h), 1
    else:
        (w, h, m), pos = _pnm_tokens(data, 3, 2)
        width, height, maxval = int(w), int(h), int(m)
    if width <= 0 or height <= 0 or not 0 < maxval < 65536:
        raise ValueError(f"corrupt PNM stream: {width}x{height}, maxval {maxval}")
    channels = 3 if kind in (b"3", b"6") else 1
    _check_size("PNM", width, height, channels, 8, max_bytes)  # int64 samples for the text formats
    count = width * height * channels
    if kind in (b"1", b"2", b"3"):
        body = data[pos:]
        if kind == b"1":  # digits may be packed without spaces
            vals = np.frombuffer(re.sub(rb"#[^\n]*|\s", b"", body), dtype=np.uint8)[:count] - ord("0")
        else:
            vals = np.array(re.sub(rb"#[^\n]*", b"", body).split()[:count], dtype=np.int64)
        if vals.size < count:
            raise ValueError(f"corrupt PNM stream: {vals.size} samples, expected {count}")
    else:
        pos += 1  # the single whitespace after the header
        if kind == b"4":
            stride = (width + 7) // 8
            rows = np.frombuffer(data[pos : pos + stride * height], dtype=np.uint8).reshape(height, stride)
            vals = np.unpackbits(rows, axis=1)[:, :width].reshape(-1)
        else:
            dt = np.uint8 if maxval < 256 else np.dtype(">u2")
            vals = np.frombuffer(data[pos : pos + count * np.dtype(dt).itemsize], dtype=dt)
            if vals.size < count:
                raise ValueError(f"corrupt PNM stream: {vals.size} samples, expected {count}")
    if kind in (b"1", b"4"):  # 1 is black
        img = np.where(vals.reshape(height, width) > 0, 0, 255).astype(np.uint8)
        return img[:, :, None]
    return _pnm_scale(vals.reshape(height, width, channels), maxval)


def _pnm_scale(vals: np.ndarray, maxval: int) -> np.ndarray:
    if maxval == 255:
        return vals.astype(np.uint8)
    v = np.minimum(vals.astype(np.uint32), maxval)
    return ((v * 255 + maxval // 2) // maxval).astype(np.uint8)


def _decode_pam(data: bytes, max_bytes: int | None) -> np.ndarray:
    end = data.find(b"ENDHDR")
    if end < 0:
        raise ValueError("corrupt PAM stream: no ENDHDR")
    fields: dict[str, str] = {}
    for line in data[3:end].decode("ascii", "replace").splitlines():
        parts = line.split("#")[0].split(None, 1)
        if len(parts) == 2:
            fields[parts[0].upper()] = parts[1].strip()
    width, height = int(fields["WIDTH"]), int(fields["HEIGHT"])
    depth, maxval = int(fields["DEPTH"]), int(fields["MAXVAL"])
    pos = data.index(b"\n", end) + 1
    dt = np.uint8 if maxval < 256 else np.dtype(">u2")
    _check_size("PAM", width, height, depth, 4, max_bytes)
    count = width * height * depth
    vals = np.frombuffer(data[pos : pos + count * np.dtype(dt).itemsize], dtype=dt)
    if vals.size < count:
        raise ValueError(f"corrupt PAM stream: {vals.size} samples, expected {count}")
    vals = vals.reshape(height, width, depth)
    if fields.get("TUPLTYPE", "").startswith("BLACKANDWHITE"):
        return (vals[:, :, :1] > 0).astype(np.uint8) * 255
    return _pnm_scale(vals, maxval)


# -- TIFF -----------------------------------------------------------------------------------------

_TIFF_TYPES = {
    1: "B",
    2: "c",
    3: "H",
    4: "I",
    5: "II",
    6: "b",
    7: "B",
    8: "h",
    9: "i",
    10: "ii",
    11: "f",
    12: "d",
    16: "Q",
}


def _tiff_tags(data: bytes, order: str, ifd: int) -> dict[int, list]:
    (n,) = struct.unpack(order + "H", data[ifd : ifd + 2])
    tags: dict[int, list] = {}
    for i in range(n):
        e = ifd + 2 + 12 * i
        tag, typ, count = struct.unpack(order + "HHI", data[e : e + 8])
        fmt = _TIFF_TYPES.get(typ)
        if fmt is None:
            continue
        size = struct.calcsize("<" + fmt) * count
        start = e + 8 if size <= 4 else struct.unpack(order + "I", data[e + 8 : e + 12])[0]
        vals = list(struct.unpack(order + fmt * count, data[start : start + size]))
        tags[tag] = vals
    return tags


def _lzw_tiff(data: bytes, expected: int) -> bytes:
    """TIFF's LZW (MSB-first codes, early change)."""
    out = bytearray()
    table = [bytes([i]) for i in range(256)] + [b"", b""]
    width = 9
    bitbuf = 0
    nbits = 0
    prev = None
    for byte in data:
        bitbuf = (bitbuf << 8) | byte
        nbits += 8
        while nbits >= width:
            nbits -= width
            code = (bitbuf >> nbits) & ((1 << width) - 1)
            if code == 256:  # clear
                table = table[:258]
                width = 9
                prev = None
                continue
            if code == 257:  # end of information
                return bytes(out)
            if prev is None:
                entry = table[code]
            elif code < len(table):
                entry = table[code]
                table.append(prev + entry[:1])
            else:
                entry = prev + prev[:1]
                table.append(entry)
            out += entry
            prev = entry
            if len(table) + 1 >= (1 << width) and width < 12:
                width += 1
            if len(out) >= expected:
                return bytes(out)
        bitbuf &= (1 << nbits) - 1
    return bytes(out)


def _packbits(data: bytes, expected: int) -> bytes:
    out = bytearray()
    i = 0
    while i < len(data) and len(out) < expected:
        n = data[i]
        i += 1
        if n < 128:
            out += data[i : i + n + 1]
            i += n + 1
        elif n > 128:
            out += data[i : i + 1] * (257 - n)
            i += 1
    return bytes(out)


def _decode_tiff(data: bytes, max_bytes: int | None) -> np.ndarray:
    order = "<" if data[:2] == b"II" else ">"
    ifd = struct.unpack(order + "I", data[4:8])[0]
    tags = _tiff_tags(data, order, ifd)
    width, height = tags[256][0], tags[257][0]
    spp = tags.get(277, [1])[0]
    bits = tags.get(258, [1])[0]
    compression = tags.get(259, [1])[0]
    photometric = tags.get(262, [1])[0]
    planar = tags.get(284, [1])[0]
    predictor = tags.get(317, [1])[0]
    if compression not in (1, 5, 8, 32773, 32946):
        name = {6: "old-style JPEG", 7: "JPEG", 2: "CCITT", 3: "CCITT G3", 4: "CCITT G4", 34712: "JPEG 2000"}
        raise UnsupportedImage(f"TIFF with {name.get(compression, f'compression {compression}')} is not supported")
    if bits not in (1, 2, 4, 8, 16) or photometric not in (0, 1, 2, 3):
        raise UnsupportedImage(
            f"TIFF with {bits}-bit samples and photometric interpretation {photometric} is not supported"
        )

    def inflate(chunk: bytes, size: int) -> bytes:
        if compression == 1:
            return chunk
        if compression == 5:
            return _lzw_tiff(chunk, size)
        if compression == 32773:
            return _packbits(chunk, size)
        return _inflate(chunk, size)

    planes = spp if planar == 2 else 1
    per_plane = 1 if planar == 2 else spp
    tiled = 322 in tags
    if tiled:
        tw, th = tags[322][0], tags[323][0]
        offsets, counts = tags[324], tags[325]
    else:
        tw, th = width, tags.get(278, [height])[0]
        offsets, counts = tags[273], tags.get(279, [len(data)] * len(tags[273]))
    row_bytes = (tw * per_plane * bits + 7) // 8
    across = (width + tw - 1) // tw if tiled else 1
    down = (height + th - 1) // th
    _check_size("TIFF", across * tw, down * th, planes * per_plane, 2 if bits == 16 else 1, max_bytes)
    img = np.zeros((planes, down * th, across * tw, per_plane), dtype=np.uint16 if bits == 16 else np.uint8)
    k = 0
    for p in range(planes):
        for ty in range(down):
            for tx in range(across):
                rows_here = th if tiled else min(th, height - ty * th)
                raw = inflate(data[offsets[k] : offsets[k] + counts[k]], row_bytes * rows_here)
                k += 1
                buf = np.frombuffer(raw[: row_bytes * rows_here].ljust(row_bytes * rows_here, b"\0"), dtype=np.uint8)
                rows = buf.reshape(rows_here, row_bytes)
                if bits == 16 and order == "<":
                    rows = rows.reshape(rows_here, -1, 2)[:, :, ::-1].reshape(rows_here, row_bytes)
                vals = _unpack_bits(rows, bits, tw * per_plane).reshape(rows_here, tw, per_plane)
                if predictor == 2:  # horizontal differencing
                    mod = 1 << bits
                    vals = (np.cumsum(vals.astype(np.int64), axis=1) % mod).astype(vals.dtype)
                img[p, ty * th : ty * th + rows_here, tx * tw : (tx + 1) * tw] = vals
    img = np.concatenate(list(img), axis=2) if planes > 1 else img[0]
    img = img[:height, :width]
    if photometric == 3:
        cmap = np.asarray(tags[320], dtype=np.uint32).reshape(3, -1)
        idx = np.minimum(img[:, :, 0], cmap.shape[1] - 1)
        return (cmap[:, idx] >> 8).transpose(1, 2, 0).astype(np.uint8)
    out = _scale_to_8bit(img, bits)
    if photometric == 0:
        out = 255 - out
    if photometric in (0, 1):
        return out[:, :, :1]
    if out.shape[2] < 3:
        raise ValueError(f"corrupt TIFF stream: RGB image with {out.shape[2]} samples per pixel")
    return out[:, :, :3]


# -- JPEG -----------------------------------------------------------------------------------------

_ZIGZAG = np.array(
    [
        0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5,
        12, 19, 26, 33, 40, 48, 41, 34, 27, 20, 13, 6, 7, 14, 21, 28,
        35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51,
        58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63,
    ]
)  # fmt: skip


class _Huffman:
    """A 16-bit lookahead table: prefix -> (code length << 8) | symbol."""

    def __init__(self, counts: bytes, symbols: bytes) -> None:
        lut = np.zeros(1 << 16, dtype=np.int32)
        code = 0
        k = 0
        for length in range(1, 17):
            for _ in range(counts[length - 1]):
                start = code << (16 - length)
                lut[start : start + (1 << (16 - length))] = (length << 8) | symbols[k]
                code += 1
                k += 1
            code <<= 1
        self.lut = lut.tolist()


class _Bits:
    """MSB-first bit reader over one entropy-coded segment (stuffing removed); zeros past the end."""

    __slots__ = ("data", "pos", "acc", "n")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0
        self.acc = 0
        self.n = 0

    def fill(self) -> None:
        data, pos = self.data, self.pos
        while self.n <= 24:
            self.acc = ((self.acc << 8) | (data[pos] if pos < len(data) else 0)) & 0xFFFFFFFF
            pos += 1
            self.n += 8
        self.pos = pos

    def decode(self, h: _Huffman) -> int:
        if self.n < 16:
            self.fill()
        e = h.lut[(self.acc >> (self.n - 16)) & 0xFFFF]
        if not e:
            raise ValueError("corrupt JPEG stream: bad Huffman code")
        self.n -= e >> 8
        return e & 0xFF

    def bits(self, s: int) -> int:
        if s == 0:
            return 0
        if self.n < s:
            self.fill()
        self.n -= s
        return (self.acc >> self.n) & ((1 << s) - 1)

    def receive_extend(self, s: int) -> int:
        if s == 0:
            return 0
        if self.n < s:
            self.fill()
        self.n -= s
        v = (self.acc >> self.n) & ((1 << s) - 1)
        return v if v >= (1 << (s - 1)) else v - (1 << s) + 1


class _Component:
    def __init__(self, cid: int, h: int, v: int, tq: int) -> None:
        self.id, self.h, self.v, self.tq = cid, h, v, tq
        self.bw = self.bh = 0  # blocks actually covering the component
        self.aw = self.ah = 0  # blocks allocated (whole MCUs)
        self.coef: list[int] = []
        self.pred = 0
        self.td = self.ta = 0


def _entropy_segments(data: bytes, start: int) -> tuple[list[bytes], int]:
    """The scan's entropy-coded data split at restart markers, and the offset of the next marker."""
    pos = start
    n = len(data)
    while True:
        pos = data.find(b"\xff", pos)
        if pos < 0 or pos + 1 >= n:
            end = n
            break
        nxt = data[pos + 1]
        if nxt == 0 or 0xD0 <= nxt <= 0xD7 or nxt == 0xFF:
            pos += 1 if nxt == 0xFF else 2
            continue
        end = pos
        break
    segs = re.split(rb"\xff[\xd0-\xd7]", data[start:end])
    return [s.replace(b"\xff\x00", b"\xff") for s in segs], end


def _idct_islow(blocks: np.ndarray) -> np.ndarray:
    """Integer 8x8 inverse DCT with 13-bit constants and two passes (the accurate integer method of
    the JPEG reference decoders), so the output matches them sample for sample."""
    c = {
        "0.298631336": 2446, "0.390180644": 3196, "0.541196100": 4433, "0.765366865": 6270,
        "0.899976223": 7373, "1.175875602": 9633, "1.501321110": 12299, "1.847759065": 15137,
        "1.961570560": 16069, "2.053119869": 16819, "2.562915447": 20995, "3.072711026": 25172,
    }  # fmt: skip

    def one_pass(x: list[np.ndarray], shift: int) -> list[np.ndarray]:
        z1 = (x[2] + x[6]) * c["0.541196100"]
        t2 = z1 - x[6] * c["1.847759065"]
        t3 = z1 + x[2] * c["0.765366865"]
        t0 = (x[0] + x[4]) << 13
        t1 = (x[0] - x[4]) << 13
        e10, e13, e11, e12 = t0 + t3, t0 - t3, t1 + t2, t1 - t2
        o0, o1, o2, o3 = x[7], x[5], x[3], x[1]
        z1, z2, z3, z4 = o0 + o3, o1 + o2, o0 + o2, o1 + o3
        z5 = (z3 + z4) * c["1.175875602"]
        o0 = o0 * c["0.298631336"]
        o1 = o1 * c["2.053119869"]
        o2 = o2 * c["3.072711026"]
        o3 = o3 * c["1.501321110"]
        z1 = -z1 * c["0.899976223"]
        z2 = -z2 * c["2.562915447"]
        z3 = -z3 * c["1.961570560"] + z5
        z4 = -z4 * c["0.390180644"] + z5
        o0 += z1 + z3
        o1 += z2 + z4
        o2 += z2 + z3
        o3 += z1 + z4
        rnd = 1 << (shift - 1)
        return [
            (e10 + o3 + rnd) >> shift,
            (e11 + o2 + rnd) >> shift,
            (e12 + o1 + rnd) >> shift,
            (e13 + o0 + rnd) >> shift,
            (e13 - o0 + rnd) >> shift,
            (e12 - o1 + rnd) >> shift,
            (e11 - o2 + rnd) >> shift,
            (e10 - o3 + rnd) >> shift,
        ]

    b = blocks.astype(np.int64).reshape(-1, 8, 8)
    cols = one_pass([b[:, k, :] for k in range(8)], 13 - 2)  # columns, keep 2 extra bits
    ws = np.stack(cols, axis=1)
    rows = one_pass([ws[:, :, k] for k in range(8)], 13 + 2 + 3)
    out = np.stack(rows, axis=2) + 128
    return np.clip(out, 0, 255).astype(np.uint8)


def _upsample(plane: np.ndarray, fh: int, fv: int) -> np.ndarray:
    """Chroma upsampling: 'fancy' triangle filters for 2x horizontal / vertical factors (with the
    alternating rounding the spec describes), plain replication for any other factor."""
    p = plane.astype(np.int32)
    if fv == 2 and fh in (1, 2):
        above = np.concatenate([p[:1], p[:-1]], axis=0)
        below = np.concatenate([p[1:], p[-1:]], axis=0)
        top = 3 * p + above
        bot = 3 * p + below
        colsum = np.stack([top, bot], axis=1).reshape(-1, p.shape[1])
        if fh == 1:
            out = np.stack([(top + 1) >> 2, (bot + 2) >> 2], axis=1).reshape(-1, p.shape[1])
            return out.astype(np.uint8)
        left = np.concatenate([colsum[:, :1], colsum[:, :-1]], axis=1)
        right = np.concatenate([colsum[:, 1:], colsum[:, -1:]], axis=1)
        even = (3 * colsum + left + 8) >> 4
        odd = (3 * colsum + right + 7) >> 4
        return np.stack([even, odd], axis=2).reshape(colsum.shape[0], -1).astype(np.uint8)
    if fh == 2 and fv == 1:
        left = np.concatenate([p[:, :1], p[:, :-1]], axis=1)
        right = np.concatenate([p[:, 1:], p[:, -1:]], axis=1)
        even = (3 * p + left + 1) >> 2
        odd = (3 * p + right + 2) >> 2
        return np.stack([even, odd], axis=2).reshape(p.shape[0], -1).astype(np.uint8)
    return np.repeat(np.repeat(plane, fv, axis=0), fh, axis=1)


def _ycc_to_rgb(y: np.ndarray, cb: np.ndarray, cr: np.ndarray) -> np.ndarray:
    """JFIF YCbCr -> RGB in 16-bit fixed point, rounded like the reference decoders' tables."""

    def fix(x: float) -> int:
        return int(x * 65536 + 0.5)

    y = y.astype(np.int64)
    cb = cb.astype(np.int64) - 128
    cr = cr.astype(np.int64) - 128
    half = 1 << 15
    r = y + ((fix(1.40200) * cr + half) >> 16)
    g = y + ((-fix(0.34414) * cb - fix(0.71414) * cr + half) >> 16)
    b = y + ((fix(1.77200) * cb + half) >> 16)
    return np.clip(np.stack([r, g, b], axis=-1), 0, 255).astype(np.uint8)


def _decode_jpeg(data: bytes, max_bytes: int | None) -> np.ndarray:
    qt: dict[int, np.ndarray] = {}
    dc_tables: dict[int, _Huffman] = {}
    ac_tables: dict[int, _Huffman] = {}
    comps: list[_Component] = []
    width = height = 0
    hmax = vmax = 1
    mcux = mcuy = 0
    restart = 0
    progressive = False
    adobe_transform: int | None = None
    jfif = False
    eobrun = [0]
    pos = 2
    n = len(data)
    frame_seen = False
    while pos < n:
        if data[pos] != 0xFF:
            pos += 1
            continue
        marker = data[pos + 1]
        pos += 2
        if marker == 0xFF:
            pos -= 1
            continue
        if marker == 0xD9:  # EOI
            break
        if marker in (0x01,) or 0xD0 <= marker <= 0xD7:
            continue
        (length,) = struct.unpack(">H", data[pos : pos + 2])
        seg = data[pos + 2 : pos + length]
        pos += length
        if marker == 0xDB:  # DQT
            i = 0
            while i < len(seg):
                pq, tq = seg[i] >> 4, seg[i] & 15
                if pq:
                    vals = np.frombuffer(seg[i + 1 : i + 129], dtype=">u2").astype(np.int64)
                    i += 129
                else:
                    vals = np.frombuffer(seg[i + 1 : i + 65], dtype=np.uint8).astype(np.int64)
                    i += 65
                table = np.zeros(64, dtype=np.int64)
                table[_ZIGZAG] = vals
                qt[tq] = table
        elif marker == 0xC4:  # DHT
            i = 0
            while i < len(seg):
                tc, th = seg[i] >> 4, seg[i] & 15
                counts = seg[i + 1 : i + 17]
                total = sum(counts)
                table = _Huffman(counts, seg[i + 17 : i + 17 + total])
                (ac_tables if tc else dc_tables)[th] = table
                i += 17 + total
        elif marker in (0xC0, 0xC1, 0xC2):  # SOF: baseline, extended, progressive (Huffman)
            precision, height, width, ncomp = struct.unpack(">BHHB", seg[:6])
            if precision != 8:
                raise UnsupportedImage(f"JPEG with {precision}-bit samples is not supported")
            if height == 0:
                raise UnsupportedImage("JPEG with the height defined by a DNL marker is not supported")
            progressive = marker == 0xC2
            comps = [
                _Component(seg[6 + 3 * k], seg[7 + 3 * k] >> 4, seg[7 + 3 * k] & 15, seg[8 + 3 * k])
                for k in range(ncomp)
            ]
            if not comps or any(c.h == 0 or c.v == 0 for c in comps):
                raise ValueError(f"corrupt JPEG stream: components {[(c.h, c.v) for c in comps]}")
            hmax = max(c.h for c in comps)
            vmax = max(c.v for c in comps)
            # Coefficients are kept as Python ints (8 bytes a reference) for whole MCUs.
            _check_size(
                "JPEG", 8 * hmax * -(-width // (8 * hmax)), 8 * vmax * -(-height // (8 * vmax)), ncomp, 8, max_bytes
            )
            mcux = -(-width // (8 * hmax))
            mcuy = -(-height // (8 * vmax))
            for c in comps:
                cw = -(-width * c.h // hmax)
                ch = -(-height * c.v // vmax)
                c.bw, c.bh = -(-cw // 8), -(-ch // 8)
                c.aw, c.ah = mcux * c.h, mcuy * c.v
                c.coef = [0] * (c.aw * c.ah * 64)
            frame_seen = True
        elif 0xC3 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            kind = {
                0xC3: "lossless",
                0xC5: "differential",
                0xC6: "differential progressive",
                0xC7: "differential lossless",
            }
            kind_name = kind.get(marker, "arithmetic-coded")
            raise UnsupportedImage(f"{kind_name} JPEG (SOF{marker - 0xC0}) is not supported")
        elif marker == 0xDD:  # DRI
            (restart,) = struct.unpack(">H", seg[:2])
        elif marker == 0xE0 and seg.startswith(b"JFIF"):
            jfif = True
        elif marker == 0xEE and seg.startswith(b"Adobe") and len(seg) >= 12:
            adobe_transform = seg[11]
        elif marker == 0xDA:  # SOS
            if not frame_seen:
                raise ValueError("corrupt JPEG stream: scan before frame header")
            ns = seg[0]
            scomps = []
            for k in range(ns):
                cid, tables = seg[1 + 2 * k], seg[2 + 2 * k]
                comp = next((c for c in comps if c.id == cid), None)
                if comp is None:
                    raise ValueError(f"corrupt JPEG stream: scan names unknown component {cid}")
                comp.td, comp.ta = tables >> 4, tables & 15
                scomps.append(comp)
            ss, se, ah_al = seg[1 + 2 * ns], seg[2 + 2 * ns], seg[3 + 2 * ns]
            segments, pos = _entropy_segments(data, pos)
            _decode_scan(
                segments, scomps, mcux, mcuy, restart, progressive, ss, se, ah_al >> 4, ah_al & 15,
                dc_tables, ac_tables, eobrun,
            )  # fmt: skip
    if not frame_seen:
        raise ValueError("corrupt JPEG stream: no frame header")
    planes = []
    for c in comps:
        if c.tq not in qt:
            raise ValueError(f"corrupt JPEG stream: missing quantization table {c.tq}")
        coef = np.asarray(c.coef, dtype=np.int64).reshape(-1, 64) * qt[c.tq]
        pix = _idct_islow(coef).reshape(c.ah, c.aw, 8, 8).transpose(0, 2, 1, 3).reshape(c.ah * 8, c.aw * 8)
        cw = -(-width * c.h // hmax)
        ch = -(-height * c.v // vmax)
        pix = pix[:ch, :cw]
        if c.h != hmax or c.v != vmax:
            if hmax % c.h or vmax % c.v:
                raise UnsupportedImage(f"JPEG with sampling factors {[(k.h, k.v) for k in comps]} is not supported")
            pix = _upsample(pix, hmax // c.h, vmax // c.v)
        planes.append(pix[:height, :width])
    if len(planes) == 1:
        return planes[0][:, :, None]
    if len(planes) == 3:
        rgb_ids = [c.id for c in comps] == [ord("R"), ord("G"), ord("B")]
        if adobe_transform == 0 or (rgb_ids and not jfif):
            return np.stack(planes, axis=-1)
        return _ycc_to_rgb(*planes)
    raise UnsupportedImage(f"JPEG with {len(planes)} components (CMYK/YCCK) is not supported")


def _decode_scan(
    segments: list[bytes],
    scomps: list[_Component],
    mcux: int,
    mcuy: int,
    restart: int,
    progressive: bool,
    ss: int,
    se: int,
    ah: int,
    al: int,
    dc_tables: dict[int, _Huffman],
    ac_tables: dict[int, _Huffman],
    eobrun: list[int],
) -> None:
    """Entropy-decode one scan into the components' coefficient lists (zigzag order)."""
    zz = _ZIGZAG.tolist()
    if len(scomps) == 1:
        c = scomps[0]
        units = [(c, [(by * c.aw + bx) * 64]) for by in range(c.bh) for bx in range(c.bw)]
    else:
        units = []
        for my in range(mcuy):
            for mx in range(mcux):
                for c in scomps:
                    bases = [((my * c.v + y) * c.aw + mx * c.h + x) * 64 for y in range(c.v) for x in range(c.h)]
                    units.append((c, bases))
    # Group the block lists into MCUs: one unit per component per MCU when interleaved.
    per_mcu = len(scomps) if len(scomps) > 1 else 1
    n_mcu = len(units) // per_mcu
    interval = restart if restart else n_mcu
    seg_i = 0
    for start in range(0, n_mcu, interval):
        if seg_i >= len(segments) and start:
            break  # no data left for this interval or later ones: their blocks stay zero
        bits = _Bits(segments[seg_i] if seg_i < len(segments) else b"")
        seg_i += 1
        for c in scomps:
            c.pred = 0
        eobrun[0] = 0
        end = len(bits.data) + 8  # a valid segment is never read more than a few bytes past its end
        for u in units[start * per_mcu : min(n_mcu, start + interval) * per_mcu]:
            if bits.pos > end:
                break  # truncated (or hostile) data: the rest of the interval stays zero
            comp, bases = u
            for base in bases:
                if not progressive:
                    _block_baseline(bits, comp, base, dc_tables[comp.td], ac_tables[comp.ta], zz)
                elif ss == 0:
                    _block_dc(bits, comp, base, dc_tables.get(comp.td), ah, al)
                elif ah == 0:
                    _block_ac_first(bits, comp, base, ac_tables[comp.ta], ss, se, al, zz, eobrun)
                else:
                    _block_ac_refine(bits, comp, base, ac_tables[comp.ta], ss, se, al, zz, eobrun)


def _block_baseline(bits: _Bits, c: _Component, base: int, dc: _Huffman, ac: _Huffman, zz: list[int]) -> None:
    coef = c.coef
    s = bits.decode(dc)
    c.pred += bits.receive_extend(s)
    coef[base] = c.pred
    k = 1
    while k < 64:
        rs = bits.decode(ac)
        r, s = rs >> 4, rs & 15
        if s:
            k += r
            if k > 63:
                break
            coef[base + zz[k]] = bits.receive_extend(s)
            k += 1
        elif r == 15:
            k += 16
        else:
            break


def _block_dc(bits: _Bits, c: _Component, base: int, dc: _Huffman | None, ah: int, al: int) -> None:
    if ah == 0:
        if dc is None:
            raise ValueError("corrupt JPEG stream: missing DC Huffman table")
        s = bits.decode(dc)
        c.pred += bits.receive_extend(s)
        c.coef[base] = c.pred * (1 << al)
    elif bits.bits(1):
        c.coef[base] |= 1 << al


def _block_ac_first(
    bits: _Bits, c: _Component, base: int, ac: _Huffman, ss: int, se: int, al: int, zz: list[int], eobrun: list[int]
) -> None:
    if eobrun[0]:
        eobrun[0] -= 1
        return
    coef = c.coef
    k = ss
    while k <= se:
        rs = bits.decode(ac)
        r, s = rs >> 4, rs & 15
        if s:
            k += r
            if k > 63:
                break
            coef[base + zz[k]] = bits.receive_extend(s) * (1 << al)
            k += 1
        elif r == 15:
            k += 16
        else:
            eobrun[0] = (1 << r) - 1 + (bits.bits(r) if r else 0)
            break


def _block_ac_refine(
    bits: _Bits, c: _Component, base: int, ac: _Huffman, ss: int, se: int, al: int, zz: list[int], eobrun: list[int]
) -> None:
    coef = c.coef
    p1 = 1 << al
    m1 = -1 << al
    k = ss
    if eobrun[0] == 0:
        while k <= se:
            rs = bits.decode(ac)
            r, s = rs >> 4, rs & 15
            value = 0
            if s:
                value = p1 if bits.bits(1) else m1
            elif r != 15:
                eobrun[0] = (1 << r) + (bits.bits(r) if r else 0)
                break
            # Skip r zero-history coefficients, refining the nonzero ones passed on the way.
            while k <= se:
                pos = base + zz[k]
                if coef[pos]:
                    if bits.bits(1) and (coef[pos] & p1) == 0:
                        coef[pos] += p1 if coef[pos] >= 0 else m1
                else:
                    if r == 0:
                        if value:
                            coef[pos] = value
                        k += 1
                        break
                    r -= 1
                k += 1
    if eobrun[0] > 0:
        while k <= se:
            pos = base + zz[k]
            if coef[pos] and bits.bits(1) and (coef[pos] & p1) == 0:
                coef[pos] += p1 if coef[pos] >= 0 else m1
            k += 1
        eobrun[0] -= 1
