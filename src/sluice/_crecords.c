/* The compiled half of protocol/records.py: decode a batch body into Record objects and
 * encode keyless record bodies, byte for byte as the pure-Python functions do.
 *
 * protocol/records.py stays the reference: it uses these functions when this module was
 * built (``pip install`` compiles it; a machine without a C compiler skips it) and the tests
 * compare the two on random batches.  Errors are raised as the ``CorruptRecord`` given to
 * ``init``, with the reference's messages.
 *
 * Record layout (varints zig-zag encoded):
 *   length | attributes int8 | timestamp_delta | offset_delta | key_length | key |
 *   value_length | value | header_count | { key_length | key utf-8 | value_length | value }*
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <limits.h>
#include <string.h>
#include <time.h>
#include <structmember.h>

static PyObject *corrupt_record = NULL; /* sluice.errors.CorruptRecord, set by init() */
static PyObject *empty_tuple = NULL;

static PyObject *
corrupt(const char *fmt, ...)
{
    va_list vargs;
    va_start(vargs, fmt);
    PyObject *msg = PyUnicode_FromFormatV(fmt, vargs);
    va_end(vargs);
    if (msg != NULL) {
        PyErr_SetObject(corrupt_record ? corrupt_record : PyExc_ValueError, msg);
        Py_DECREF(msg);
    }
    return NULL;
}

/* Status of a varint read: 0 ok, -1 truncated (the reference's "record runs past its
 * batch" inside a record), -2 overflow. */
static inline int
read_varint(const uint8_t *p, Py_ssize_t end, Py_ssize_t *pos, int64_t *out)
{
    Py_ssize_t i = *pos;
    if (i < end && p[i] < 0x80) { /* the common case: one byte */
        uint8_t b = p[i];
        *out = (int64_t)(b >> 1) ^ -(int64_t)(b & 1);
        *pos = i + 1;
        return 0;
    }
    uint64_t result = 0;
    int shift = 0;
    for (;;) {
        if (i >= end)
            return -1;
        uint8_t b = p[i++];
        if (shift == 63 && b > 1)
            return -2;
        result |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80)
            break;
        shift += 7;
    }
    *out = (int64_t)(result >> 1) ^ -(int64_t)(result & 1);
    *pos = i;
    return 0;
}

/* An int64 sum as a Python int, exact even when it overflows int64 (as the reference's). */
static PyObject *
sum_as_long(int64_t a, int64_t b)
{
    int64_t r;
    if (!__builtin_add_overflow(a, b, &r))
        return PyLong_FromLongLong(r);
    PyObject *pa = PyLong_FromLongLong(a), *pb = PyLong_FromLongLong(b), *s = NULL;
    if (pa && pb)
        s = PyNumber_Add(pa, pb);
    Py_XDECREF(pa);
    Py_XDECREF(pb);
    return s;
}

#define NEED_VARINT(var)                                                        \
    do {                                                                        \
        int st_ = read_varint(p, end, &pos, &(var));                            \
        if (st_ == -1)                                                          \
            goto truncated;                                                     \
        if (st_ == -2) {                                                        \
            corrupt("varint overflows 64 bits");                                \
            goto fail;                                                          \
        }                                                                       \
    } while (0)

static PyObject *
decode_headers(const uint8_t *p, Py_ssize_t end, Py_ssize_t *ppos, int *truncated)
{
    Py_ssize_t pos = *ppos;
    int64_t count, klen, vlen;
    PyObject *headers = NULL;
    *truncated = 0;
    NEED_VARINT(count);
    if (count < 0 || count > end) {
        corrupt("bad header count %lld", (long long)count);
        return NULL;
    }
    headers = PyTuple_New((Py_ssize_t)count);
    if (headers == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < count; i++) {
        NEED_VARINT(klen);
        if (klen < 0) {
            corrupt("null header key");
            goto fail;
        }
        if (klen > end - pos) /* the reference slices short, then runs past the batch */
            goto truncated;
        PyObject *key = PyUnicode_DecodeUTF8((const char *)p + pos, (Py_ssize_t)klen, NULL);
        if (key == NULL) {
            if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                PyErr_Clear();
                corrupt("header key is not UTF-8");
            }
            goto fail;
        }
        pos += (Py_ssize_t)klen;
        int st = read_varint(p, end, &pos, &vlen);
        if (st != 0) {
            Py_DECREF(key);
            if (st == -1)
                goto truncated;
            corrupt("varint overflows 64 bits");
            goto fail;
        }
        PyObject *value;
        if (vlen < 0) {
            value = Py_NewRef(Py_None);
        } else {
            if (vlen > end - pos) {
                /* the reference keeps the short slice and moves past the end: the record's
                 * length check then fails, or the next read runs past the batch */
                Py_DECREF(key);
                goto truncated;
            }
            value = PyBytes_FromStringAndSize((const char *)p + pos, (Py_ssize_t)vlen);
            if (value == NULL) {
                Py_DECREF(key);
                goto fail;
            }
            pos += (Py_ssize_t)vlen;
        }
        PyObject *pair = PyTuple_New(2);
        if (pair == NULL) {
            Py_DECREF(key);
            Py_DECREF(value);
            goto fail;
        }
        PyTuple_SET_ITEM(pair, 0, key);
        PyTuple_SET_ITEM(pair, 1, value);
        PyTuple_SET_ITEM(headers, i, pair);
    }
    *ppos = pos;
    return headers;
truncated:
    *truncated = 1;
fail:
    Py_XDECREF(headers);
    return NULL;
}

/* A key's or value's length and bytes at p[*pos]: bytes, or None for the length -1 in its
 * one-byte form (any other negative length is corrupt, as in the reference).  0 ok, -1
 * truncated, -2 an error set. */
static int
read_nullable(const uint8_t *p, Py_ssize_t end, Py_ssize_t *pos, PyObject **out, const char *what)
{
    if (*pos < end && p[*pos] == 1) {
        *out = Py_NewRef(Py_None);
        *pos += 1;
        return 0;
    }
    int64_t len;
    int st = read_varint(p, end, pos, &len);
    if (st == -2) {
        corrupt("varint overflows 64 bits");
        return -2;
    }
    if (st == -1)
        return -1;
    if (len < 0) {
        corrupt("bad %s length %lld", what, (long long)len);
        return -2;
    }
    if (len > end - *pos)
        return -1;
    *out = PyBytes_FromStringAndSize((const char *)p + *pos, (Py_ssize_t)len);
    if (*out == NULL)
        return -2;
    *pos += (Py_ssize_t)len;
    return 0;
}

PyDoc_STRVAR(decode_body_doc,
"decode_body(body, count, base_offset, base_ts, append_ts, min_offset, topic, partition,\n"
"            factory, out[, max_offset, extra])\n\n"
"Decode the ``count`` records of one uncompressed batch body into ``factory(topic,\n"
"partition, offset, timestamp, key, value, headers, *extra)`` objects appended to the list\n"
"``out``, keeping those with ``min_offset <= offset`` (and ``offset < max_offset`` unless it\n"
"is None).  ``append_ts`` (or None) replaces every record's timestamp.  Every record is\n"
"checked, kept or not.  Raises CorruptRecord as records._decode_body_py does.");

#define MAX_EXTRA 8

static PyObject *
decode_body(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 10 && nargs != 12) {
        PyErr_SetString(PyExc_TypeError, "decode_body takes 10 or 12 arguments");
        return NULL;
    }
    PyObject *max_obj = nargs == 12 ? args[10] : Py_None;
    PyObject *extra = nargs == 12 ? args[11] : NULL;
    if (extra != NULL && (!PyTuple_Check(extra) || PyTuple_GET_SIZE(extra) > MAX_EXTRA)) {
        PyErr_SetString(PyExc_TypeError, "extra must be a tuple of at most 8 items");
        return NULL;
    }
    Py_ssize_t nextra = extra ? PyTuple_GET_SIZE(extra) : 0;
    long long max_offset = max_obj == Py_None ? LLONG_MAX : PyLong_AsLongLong(max_obj);
    int bounded = max_obj != Py_None;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t count = PyLong_AsSsize_t(args[1]);
    long long base_offset = PyLong_AsLongLong(args[2]);
    long long base_ts = PyLong_AsLongLong(args[3]);
    PyObject *append_ts = args[4];
    long long min_offset = PyLong_AsLongLong(args[5]);
    PyObject *topic = args[6], *partition = args[7], *factory = args[8], *out = args[9];
    if (PyErr_Occurred()) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (!PyList_Check(out)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_TypeError, "out must be a list");
        return NULL;
    }
    const uint8_t *p = (const uint8_t *)view.buf;
    Py_ssize_t pos = 0, end = view.len;
    int64_t length, ts_delta, off_delta;
    PyObject *ts_fixed = append_ts == Py_None ? NULL : append_ts;
    PyObject *key = NULL, *value = NULL, *headers = NULL;

    for (Py_ssize_t n = 0; n < count; n++) {
        NEED_VARINT(length);
        if (length < 0 || length > end - pos) {
            corrupt("record length runs past its batch");
            goto fail;
        }
        Py_ssize_t rec_end = pos + (Py_ssize_t)length;
        pos += 1; /* attributes */
        NEED_VARINT(ts_delta);
        NEED_VARINT(off_delta);
        int st = read_nullable(p, end, &pos, &key, "key");
        if (st == 0)
            st = read_nullable(p, end, &pos, &value, "value");
        if (st == -1)
            goto truncated;
        if (st < 0)
            goto fail;
        if (pos >= end)
            goto truncated;
        if (p[pos] == 0) {
            headers = Py_NewRef(empty_tuple);
            pos += 1;
        } else {
            int trunc;
            headers = decode_headers(p, end, &pos, &trunc);
            if (headers == NULL) {
                if (trunc)
                    goto truncated;
                goto fail;
            }
        }
        if (pos != rec_end) {
            corrupt("record fields take %zd of its %lld bytes", pos - rec_end + (Py_ssize_t)length,
                    (long long)length);
            goto fail;
        }
        int64_t offset;
        int big = __builtin_add_overflow((int64_t)base_offset, off_delta, &offset);
        if (big ? off_delta < 0 || bounded : offset < min_offset || (bounded && offset >= max_offset)) {
            Py_CLEAR(key);
            Py_CLEAR(value);
            Py_CLEAR(headers);
            continue;
        }
        PyObject *off_obj = big ? sum_as_long(base_offset, off_delta) : PyLong_FromLongLong(offset);
        PyObject *ts_obj = ts_fixed ? Py_NewRef(ts_fixed) : sum_as_long(base_ts, ts_delta);
        if (off_obj == NULL || ts_obj == NULL) {
            Py_XDECREF(off_obj);
            Py_XDECREF(ts_obj);
            goto fail;
        }
        PyObject *rargs[7 + MAX_EXTRA] = {topic, partition, off_obj, ts_obj, key, value, headers};
        for (Py_ssize_t e = 0; e < nextra; e++)
            rargs[7 + e] = PyTuple_GET_ITEM(extra, e);
        PyObject *rec = PyObject_Vectorcall(factory, rargs, 7 + nextra, NULL);
        Py_DECREF(off_obj);
        Py_DECREF(ts_obj);
        Py_CLEAR(key);
        Py_CLEAR(value);
        Py_CLEAR(headers);
        if (rec == NULL)
            goto fail;
        int rc = PyList_Append(out, rec);
        Py_DECREF(rec);
        if (rc < 0)
            goto fail;
    }
    if (pos != end) {
        corrupt("%zd stray bytes after the last record of a batch", end - pos);
        goto fail;
    }
    PyBuffer_Release(&view);
    Py_RETURN_NONE;

truncated:
    corrupt("record runs past its batch");
fail:
    Py_XDECREF(key);
    Py_XDECREF(value);
    Py_XDECREF(headers);
    PyBuffer_Release(&view);
    return NULL;
}

/* ------------------------------------------------------------------------ encoding */

static inline Py_ssize_t
varint_size(int64_t n)
{
    uint64_t u = ((uint64_t)n << 1) ^ (uint64_t)(n >> 63);
    Py_ssize_t s = 1;
    while (u >= 0x80) {
        u >>= 7;
        s++;
    }
    return s;
}

static inline uint8_t *
put_varint(uint8_t *q, int64_t n)
{
    uint64_t u = ((uint64_t)n << 1) ^ (uint64_t)(n >> 63);
    while (u >= 0x80) {
        *q++ = (uint8_t)((u & 0x7F) | 0x80);
        u >>= 7;
    }
    *q++ = (uint8_t)u;
    return q;
}

PyDoc_STRVAR(encode_keyless_doc,
"encode_keyless(values, first_delta) -> bytes\n\n"
"The bodies of keyless, header-less records with timestamp delta 0 and offset deltas from\n"
"``first_delta``, concatenated: records.encode_keyless_records without its table limit.\n"
"``values`` is a sequence of bytes-like objects.");

static PyObject *
encode_keyless(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "encode_keyless takes 2 arguments");
        return NULL;
    }
    long long first = PyLong_AsLongLong(args[1]);
    if (first == -1 && PyErr_Occurred())
        return NULL;
    PyObject *seq = PySequence_Fast(args[0], "values must be a sequence of bytes");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_buffer b;
        if (PyObject_GetBuffer(items[i], &b, PyBUF_SIMPLE) < 0) {
            Py_DECREF(seq);
            return NULL;
        }
        Py_ssize_t vlen = b.len;
        PyBuffer_Release(&b);
        /* attributes, timestamp delta 0, offset delta, null key, value length, value, 0 headers */
        Py_ssize_t body = 2 + varint_size(first + i) + 1 + varint_size(vlen) + vlen + 1;
        total += varint_size(body) + body;
    }
    PyObject *result = PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    uint8_t *q = (uint8_t *)PyBytes_AS_STRING(result), *stop = q + total;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_buffer b;
        if (PyObject_GetBuffer(items[i], &b, PyBUF_SIMPLE) < 0)
            goto fail;
        Py_ssize_t vlen = b.len;
        Py_ssize_t body = 2 + varint_size(first + i) + 1 + varint_size(vlen) + vlen + 1;
        if (varint_size(body) + body > stop - q) { /* a value that grew in between */
            PyBuffer_Release(&b);
            PyErr_SetString(PyExc_RuntimeError, "a record value changed size while encoding");
            goto fail;
        }
        q = put_varint(q, body);
        *q++ = 0; /* attributes */
        *q++ = 0; /* timestamp delta */
        q = put_varint(q, first + i);
        *q++ = 1; /* null key */
        q = put_varint(q, vlen);
        memcpy(q, b.buf, (size_t)vlen);
        q += vlen;
        *q++ = 0; /* no headers */
        PyBuffer_Release(&b);
    }
    if (q != stop) {
        PyErr_SetString(PyExc_RuntimeError, "a record value changed size while encoding");
        goto fail;
    }
    Py_DECREF(seq);
    return result;
fail:
    Py_DECREF(seq);
    Py_DECREF(result);
    return NULL;
}

/* A bytes-like object or None, held for encoding; len -1 for None. */
typedef struct {
    Py_buffer view;
    Py_ssize_t len;
    int held;
} field_t;

static int
hold_field(PyObject *obj, field_t *f, const char *what)
{
    f->held = 0;
    if (obj == Py_None) {
        f->len = -1;
        return 0;
    }
    if (PyObject_GetBuffer(obj, &f->view, PyBUF_SIMPLE) < 0) {
        PyErr_Format(PyExc_TypeError, "%s must be bytes or None, not %.80s", what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    f->held = 1;
    f->len = f->view.len;
    return 0;
}

static void
release_field(field_t *f)
{
    if (f->held)
        PyBuffer_Release(&f->view);
    f->held = 0;
}

static inline Py_ssize_t
field_size(const field_t *f)
{
    return f->len < 0 ? 1 : varint_size(f->len) + f->len;
}

static inline uint8_t *
put_field(uint8_t *q, const field_t *f)
{
    if (f->len < 0) {
        *q++ = 1;
        return q;
    }
    q = put_varint(q, f->len);
    memcpy(q, f->view.buf, (size_t)f->len);
    return q + f->len;
}

typedef struct {
    PyObject *pair; /* the header as a fast sequence of 2 (owned) */
    const char *name; /* utf-8 of its name, borrowed from the str */
    Py_ssize_t name_len;
    field_t value;
} header_t;

/* One record's fields held for encoding, and its size. */
typedef struct {
    long long od, td;
    field_t key, value;
    PyObject *seq; /* the headers as a fast sequence, or NULL */
    header_t *hs;
    Py_ssize_t nh, ready;
    Py_ssize_t body; /* bytes after the length varint */
} record_t;

static void
release_record(record_t *r)
{
    for (Py_ssize_t i = 0; i < r->ready; i++) {
        release_field(&r->hs[i].value);
        Py_XDECREF(r->hs[i].pair);
    }
    PyMem_Free(r->hs);
    release_field(&r->key);
    release_field(&r->value);
    Py_XDECREF(r->seq);
}

/* Hold a record's fields and size it; -1 with an exception set (and nothing held) when a
 * field is not what the format takes. */
static int
hold_record(record_t *r, long long od, long long td, PyObject *key, PyObject *value, PyObject *headers)
{
    memset(r, 0, sizeof(*r));
    r->od = od;
    r->td = td;
    if (hold_field(key, &r->key, "record key") < 0)
        return -1;
    if (hold_field(value, &r->value, "record value") < 0)
        goto fail;
    if (headers != Py_None) {
        r->seq = PySequence_Fast(headers, "headers must be a sequence of (str, bytes) pairs");
        if (r->seq == NULL)
            goto fail;
        r->nh = PySequence_Fast_GET_SIZE(r->seq);
        if (r->nh && (r->hs = PyMem_Calloc((size_t)r->nh, sizeof(header_t))) == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
    }
    r->body = 1 + varint_size(r->td) + varint_size(r->od) + field_size(&r->key) + field_size(&r->value)
        + varint_size(r->nh);
    for (Py_ssize_t i = 0; i < r->nh; i++) {
        header_t *h = &r->hs[i];
        h->pair = PySequence_Fast(PySequence_Fast_GET_ITEM(r->seq, i), "a header is a (name, value) pair");
        if (h->pair == NULL)
            goto fail;
        r->ready = i + 1;
        if (PySequence_Fast_GET_SIZE(h->pair) != 2) {
            PyErr_SetString(PyExc_ValueError, "a header is a (name, value) pair");
            goto fail;
        }
        PyObject *name = PySequence_Fast_GET_ITEM(h->pair, 0);
        if (!PyUnicode_Check(name)) {
            PyErr_Format(PyExc_TypeError, "header name must be str, not %.80s", Py_TYPE(name)->tp_name);
            goto fail;
        }
        h->name = PyUnicode_AsUTF8AndSize(name, &h->name_len);
        if (h->name == NULL)
            goto fail;
        if (hold_field(PySequence_Fast_GET_ITEM(h->pair, 1), &h->value, "header value") < 0)
            goto fail;
        r->body += varint_size(h->name_len) + h->name_len + field_size(&h->value);
    }
    return 0;
fail:
    release_record(r);
    return -1;
}

static inline Py_ssize_t
record_size(const record_t *r)
{
    return varint_size(r->body) + r->body;
}

static void
write_record(uint8_t *q, const record_t *r)
{
    q = put_varint(q, r->body);
    *q++ = 0; /* attributes */
    q = put_varint(q, r->td);
    q = put_varint(q, r->od);
    q = put_field(q, &r->key);
    q = put_field(q, &r->value);
    q = put_varint(q, r->nh);
    for (Py_ssize_t i = 0; i < r->nh; i++) {
        q = put_varint(q, r->hs[i].name_len);
        memcpy(q, r->hs[i].name, (size_t)r->hs[i].name_len);
        q += r->hs[i].name_len;
        q = put_field(q, &r->hs[i].value);
    }
}

PyDoc_STRVAR(encode_record_doc,
"encode_record(offset_delta, timestamp_delta, key, value, headers) -> bytes\n\n"
"One record, length-prefixed: records.encode_record.  ``key`` and ``value`` are bytes-like\n"
"or None; ``headers`` a sequence of (str, bytes-like or None) pairs, or None.");

static PyObject *
encode_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "encode_record takes 5 arguments");
        return NULL;
    }
    long long od = PyLong_AsLongLong(args[0]);
    if (od == -1 && PyErr_Occurred())
        return NULL;
    long long td = PyLong_AsLongLong(args[1]);
    if (td == -1 && PyErr_Occurred())
        return NULL;
    record_t r;
    if (hold_record(&r, od, td, args[2], args[3], args[4]) < 0)
        return NULL;
    PyObject *result = PyBytes_FromStringAndSize(NULL, record_size(&r));
    if (result != NULL)
        write_record((uint8_t *)PyBytes_AS_STRING(result), &r);
    release_record(&r);
    return result;
}

/* Resize the bytearray ``buf`` to ``size`` bytes, its allocation doubling when it must
 * grow: a batch built record by record copies each byte about twice, not the eight times
 * of bytearray's own 1/8 growth.  (bytearray keeps its allocation when it shrinks by less
 * than half, so growing past the size and shrinking back keeps the room.) */
static int
grow(PyObject *buf, Py_ssize_t size)
{
    Py_ssize_t alloc = ((PyByteArrayObject *)buf)->ob_alloc;
    if (size >= alloc && alloc > 0 && size < 2 * alloc) {
        if (PyByteArray_Resize(buf, 2 * alloc) < 0)
            return -1;
    }
    return PyByteArray_Resize(buf, size);
}

/* Append a record to the bytearray ``buf`` if ``buf`` then holds at most ``limit`` bytes:
 * its size, 0 when it would not fit, -1 with an exception set (``buf`` unchanged). */
static Py_ssize_t
append_to(PyObject *buf, Py_ssize_t limit, long long od, long long td, PyObject *key, PyObject *value,
          PyObject *headers)
{
    record_t r;
    if (hold_record(&r, od, td, key, value, headers) < 0)
        return -1;
    Py_ssize_t have = PyByteArray_GET_SIZE(buf), size = record_size(&r);
    if (have + size > limit) {
        release_record(&r);
        return 0;
    }
    if (grow(buf, have + size) < 0) {
        release_record(&r);
        return -1;
    }
    write_record((uint8_t *)PyByteArray_AS_STRING(buf) + have, &r);
    release_record(&r);
    return size;
}

PyDoc_STRVAR(append_record_doc,
"append_record(buf, limit, offset_delta, timestamp_delta, key, value, headers) -> int\n\n"
"Append one record (as encode_record encodes it) to the bytearray ``buf`` if ``buf`` then\n"
"holds at most ``limit`` bytes; return the record's size, or 0 when it would not fit\n"
"(``buf`` unchanged).  Raises, leaving ``buf`` unchanged, on arguments encode_record rejects.");

static PyObject *
append_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "append_record takes 7 arguments");
        return NULL;
    }
    if (!PyByteArray_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "append_record needs a bytearray");
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(args[1]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    long long od = PyLong_AsLongLong(args[2]);
    if (od == -1 && PyErr_Occurred())
        return NULL;
    long long td = PyLong_AsLongLong(args[3]);
    if (td == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t size = append_to(args[0], limit, od, td, args[4], args[5], args[6]);
    return size < 0 ? NULL : PyLong_FromSsize_t(size);
}

/* ------------------------------------------------------------ the producer's batches */

/* The per-record state of an open batch (client/accumulator.py subclasses it as Batch):
 * the records encoded so far in ``buf`` (a bytearray; the built batch's bytes later, or
 * None), the sink and timestamp of each, and their count, size, reserved memory and
 * timestamp range.  ``add`` and ``resolve_records`` are the per-record work of a batch. */
typedef struct {
    PyObject_HEAD
    PyObject *buf, *futures, *timestamps;
    long long count, size, reserved, base_ts, max_ts;
} RecordBuffer;

static PyTypeObject RecordBufferType;

static PyObject *
RecordBuffer_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    RecordBuffer *self = (RecordBuffer *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->buf = PyByteArray_FromStringAndSize(NULL, 0);
    self->futures = PyList_New(0);
    self->timestamps = PyList_New(0);
    if (self->buf == NULL || self->futures == NULL || self->timestamps == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int
RecordBuffer_traverse(RecordBuffer *self, visitproc visit, void *arg)
{
    Py_VISIT(self->buf);
    Py_VISIT(self->futures);
    Py_VISIT(self->timestamps);
    return 0;
}

static int
RecordBuffer_clear(RecordBuffer *self)
{
    Py_CLEAR(self->buf);
    Py_CLEAR(self->futures);
    Py_CLEAR(self->timestamps);
    return 0;
}

static void
RecordBuffer_dealloc(RecordBuffer *self)
{
    PyObject_GC_UnTrack(self);
    RecordBuffer_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* RecordBuffer.add without argument parsing: 1 added, 0 would not fit, -1 error. */
static int
buffer_add(RecordBuffer *self, Py_ssize_t limit, PyObject *key, PyObject *value, PyObject *headers,
           long long ts, PyObject *sink, long long reserved)
{
    if (self->buf == NULL || !PyByteArray_CheckExact(self->buf) || self->futures == NULL
        || self->timestamps == NULL || !PyList_CheckExact(self->futures) || !PyList_CheckExact(self->timestamps)) {
        PyErr_SetString(PyExc_RuntimeError, "a record added to a batch already built");
        return -1;
    }
    Py_ssize_t size = append_to(self->buf, limit, self->count, ts - self->base_ts, key, value, headers);
    if (size <= 0)
        return (int)size;
    PyObject *t = PyLong_FromLongLong(ts);
    if (t == NULL || PyList_Append(self->timestamps, t) < 0) {
        Py_XDECREF(t);
        goto undo;
    }
    Py_DECREF(t);
    if (PyList_Append(self->futures, sink) < 0) {
        PyList_SetSlice(self->timestamps, self->count, self->count + 1, NULL);
        goto undo;
    }
    self->count++;
    self->size += size;
    self->reserved += reserved;
    if (ts > self->max_ts)
        self->max_ts = ts;
    return 1;
undo: /* out of memory: take the record back out */
    PyByteArray_Resize(self->buf, PyByteArray_GET_SIZE(self->buf) - size);
    return -1;
}

PyDoc_STRVAR(add_doc,
"add(limit, key, value, headers, timestamp, sink, reserved) -> bool\n\n"
"Encode one record into the batch if its records then take at most ``limit`` bytes;\n"
"False (nothing added) when they would not.  ``sink`` (an asyncio or concurrent future,\n"
"or any object with ``done``, ``set_result`` and ``set_exception``) is told its outcome.\n"
"Raises, adding nothing, on a record the format cannot encode.");

static PyObject *
RecordBuffer_add(RecordBuffer *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "add takes 7 arguments");
        return NULL;
    }
    Py_ssize_t limit = PyLong_AsSsize_t(args[0]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    long long ts = PyLong_AsLongLong(args[4]);
    if (ts == -1 && PyErr_Occurred())
        return NULL;
    long long reserved = PyLong_AsLongLong(args[6]);
    if (reserved == -1 && PyErr_Occurred())
        return NULL;
    int added = buffer_add(self, limit, args[1], args[2], args[3], ts, args[5], reserved);
    if (added < 0)
        return NULL;
    return PyBool_FromLong(added);
}

static PyObject *str_done, *str_set_result, *str_used, *str_limit, *str_waiters;

PyDoc_STRVAR(resolve_records_doc,
"resolve_records(meta_type, topic, partition, base_offset, append_time) -> None\n\n"
"Tell each record's sink not done yet its metadata, ``meta_type((topic, partition, offset,\n"
"timestamp))`` (a tuple subclass of 4 fields): offsets count from ``base_offset`` (all -1\n"
"when it is -1), the timestamp is ``append_time`` unless it is -1, else the record's.");

static PyObject *
RecordBuffer_resolve_records(RecordBuffer *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "resolve_records takes 5 arguments");
        return NULL;
    }
    PyTypeObject *meta = (PyTypeObject *)args[0];
    if (!PyType_Check(args[0]) || !PyType_IsSubtype(meta, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "meta_type must be a tuple subclass");
        return NULL;
    }
    long long off = PyLong_AsLongLong(args[3]);
    if (off == -1 && PyErr_Occurred())
        return NULL;
    long long append_time = PyLong_AsLongLong(args[4]);
    if (append_time == -1 && PyErr_Occurred())
        return NULL;
    if (self->futures == NULL || self->timestamps == NULL || !PyList_CheckExact(self->futures)
        || !PyList_CheckExact(self->timestamps)
        || PyList_GET_SIZE(self->futures) != PyList_GET_SIZE(self->timestamps)) {
        PyErr_SetString(PyExc_RuntimeError, "a batch's sinks and timestamps differ in number");
        return NULL;
    }
    long long step = off >= 0 ? 1 : 0;
    PyObject *futures = Py_NewRef(self->futures), *timestamps = Py_NewRef(self->timestamps);
    PyObject *result = NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(futures); i++, off += step) {
        PyObject *fut = PyList_GET_ITEM(futures, i);
        PyObject *done = PyObject_CallMethodNoArgs(fut, str_done);
        if (done == NULL)
            goto out;
        int is_done = PyObject_IsTrue(done);
        Py_DECREF(done);
        if (is_done < 0)
            goto out;
        if (is_done)
            continue;
        PyObject *m = meta->tp_alloc(meta, 4);
        if (m == NULL)
            goto out;
        PyObject *ts = append_time != -1 ? PyLong_FromLongLong(append_time)
                                         : Py_NewRef(PyList_GET_ITEM(timestamps, i));
        PyObject *o = PyLong_FromLongLong(off);
        if (ts == NULL || o == NULL) {
            Py_XDECREF(ts);
            Py_XDECREF(o);
            Py_DECREF(m);
            goto out;
        }
        PyTuple_SET_ITEM(m, 0, Py_NewRef(args[1]));
        PyTuple_SET_ITEM(m, 1, Py_NewRef(args[2]));
        PyTuple_SET_ITEM(m, 2, o);
        PyTuple_SET_ITEM(m, 3, ts);
        PyObject *r = PyObject_CallMethodOneArg(fut, str_set_result, m);
        Py_DECREF(m);
        if (r == NULL)
            goto out;
        Py_DECREF(r);
    }
    result = Py_NewRef(Py_None);
out:
    Py_DECREF(futures);
    Py_DECREF(timestamps);
    return result;
}

static PyMethodDef RecordBuffer_methods[] = {
    {"add", (PyCFunction)(void (*)(void))RecordBuffer_add, METH_FASTCALL, add_doc},
    {"resolve_records", (PyCFunction)(void (*)(void))RecordBuffer_resolve_records, METH_FASTCALL,
     resolve_records_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef RecordBuffer_members[] = {
    {"buf", T_OBJECT, offsetof(RecordBuffer, buf), 0, "the records encoded so far (bytearray), or the built batch"},
    {"futures", T_OBJECT, offsetof(RecordBuffer, futures), 0, "each record's sink"},
    {"timestamps", T_OBJECT, offsetof(RecordBuffer, timestamps), 0, "each record's timestamp"},
    {"count", T_LONGLONG, offsetof(RecordBuffer, count), 0, "records"},
    {"size", T_LONGLONG, offsetof(RecordBuffer, size), 0, "bytes of the encoded records"},
    {"reserved", T_LONGLONG, offsetof(RecordBuffer, reserved), 0, "buffer memory reserved by them"},
    {"base_ts", T_LONGLONG, offsetof(RecordBuffer, base_ts), 0, "the first record's timestamp"},
    {"max_ts", T_LONGLONG, offsetof(RecordBuffer, max_ts), 0, "the greatest timestamp"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject RecordBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sluice._crecords.RecordBuffer",
    .tp_doc = "The per-record state of a producer's batch (client/accumulator.py).",
    .tp_basicsize = sizeof(RecordBuffer),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = RecordBuffer_new,
    .tp_dealloc = (destructor)RecordBuffer_dealloc,
    .tp_traverse = (traverseproc)RecordBuffer_traverse,
    .tp_clear = (inquiry)RecordBuffer_clear,
    .tp_methods = RecordBuffer_methods,
    .tp_members = RecordBuffer_members,
};

/* ------------------------------------------------------- the producer's per-record path */

/* Producer._append_now for the common record, in one call: a record of bytes (a key or
 * none, no headers) for a topic whose route is current, that fits in its partition's open
 * batch, with memory free.  Everything else, and anything unusual, is left to the Python
 * path, which ``append`` tells by returning False after changing nothing.  ``send`` is
 * Producer.send in C around it (the producer makes it its ``send`` with the compiled codec). */
typedef struct {
    PyObject_HEAD
    PyObject *producer, *topics, *routes, *lanes, *open, *memory, *sticky, *crc32c, *on_full, *py_send;
    int partitioner; /* a custom partitioner: keyed and keyless records choose in Python */
    long long header_size, slack;
} Appender;

static PyObject *str_loop, *str_closing, *str_sender, *str_fenced, *str_create_future, *str_set_exception,
    *str_send_rest, *str_key, *str_headers, *str_partition, *str_timestamp_ms;

static int
Appender_traverse(Appender *self, visitproc visit, void *arg)
{
    Py_VISIT(self->producer);
    Py_VISIT(self->topics);
    Py_VISIT(self->routes);
    Py_VISIT(self->lanes);
    Py_VISIT(self->open);
    Py_VISIT(self->memory);
    Py_VISIT(self->sticky);
    Py_VISIT(self->crc32c);
    Py_VISIT(self->on_full);
    Py_VISIT(self->py_send);
    return 0;
}

static int
Appender_clear(Appender *self)
{
    Py_CLEAR(self->producer);
    Py_CLEAR(self->topics);
    Py_CLEAR(self->routes);
    Py_CLEAR(self->lanes);
    Py_CLEAR(self->open);
    Py_CLEAR(self->memory);
    Py_CLEAR(self->sticky);
    Py_CLEAR(self->crc32c);
    Py_CLEAR(self->on_full);
    Py_CLEAR(self->py_send);
    return 0;
}

static void
Appender_dealloc(Appender *self)
{
    PyObject_GC_UnTrack(self);
    Appender_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Appender_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    PyObject *producer, *topics, *routes, *lanes, *open, *memory, *sticky, *crc32c, *on_full, *py_send;
    int partitioner;
    long long header_size, slack;
    static char *names[] = {"producer", "topics", "routes", "lanes", "open", "memory", "sticky", "crc32c",
                            "on_full", "py_send", "partitioner", "header_size", "slack", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO!O!O!O!OO!OOOpLL:Appender", names, &producer, &PyDict_Type,
                                     &topics, &PyDict_Type, &routes, &PyDict_Type, &lanes, &PyDict_Type, &open,
                                     &memory, &PyDict_Type, &sticky, &crc32c, &on_full, &py_send, &partitioner,
                                     &header_size, &slack))
        return NULL;
    Appender *self = (Appender *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->producer = Py_NewRef(producer);
    self->topics = Py_NewRef(topics);
    self->routes = Py_NewRef(routes);
    self->lanes = Py_NewRef(lanes);
    self->open = Py_NewRef(open);
    self->memory = Py_NewRef(memory);
    self->sticky = Py_NewRef(sticky);
    self->crc32c = Py_NewRef(crc32c);
    self->on_full = Py_NewRef(on_full);
    self->py_send = Py_NewRef(py_send);
    self->partitioner = partitioner;
    self->header_size = header_size;
    self->slack = slack;
    return (PyObject *)self;
}

/* A Python int as a long long, or -1 (not an int, or out of range: the Python path decides). */
static long long
small_int(PyObject *o)
{
    if (!PyLong_CheckExact(o))
        return -1;
    long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred())
        PyErr_Clear();
    return v;
}

static long long
now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* ``append`` without argument parsing: 1 buffered, 0 left to the Python path (nothing
 * changed), -1 error (nothing buffered). */
static int
append_impl(Appender *self, PyObject *topic, PyObject *value, PyObject *key, PyObject *headers, PyObject *part,
            PyObject *tsobj, PyObject *sink)
{
    if (headers != Py_None || !PyBytes_CheckExact(value) || (key != Py_None && !PyBytes_CheckExact(key))
        || !PyUnicode_CheckExact(topic))
        return 0;
    int waiting = PyDict_Contains(self->lanes, topic);
    if (waiting != 0)
        return waiting < 0 ? -1 : 0;
    PyObject *route = PyDict_GetItemWithError(self->routes, topic); /* borrowed */
    if (route == NULL)
        return PyErr_Occurred() ? -1 : 0;
    PyObject *info = PyDict_GetItemWithError(self->topics, topic);
    if (info == NULL && PyErr_Occurred())
        return -1;
    if (!PyTuple_CheckExact(route) || PyTuple_GET_SIZE(route) != 4 || PyTuple_GET_ITEM(route, 0) != info)
        return 0;
    long long n = small_int(PyTuple_GET_ITEM(route, 1));
    long long limit = small_int(PyTuple_GET_ITEM(route, 2));
    long long cap = small_int(PyTuple_GET_ITEM(route, 3));
    if (n <= 0 || limit <= 0 || cap <= 0)
        return 0;
    long long p;
    int sticky = 0;
    if (part != Py_None) {
        p = small_int(part);
        if (p < 0 || p >= n)
            return 0;
    } else if (self->partitioner) {
        return 0;
    } else if (key == Py_None) {
        PyObject *s = PyDict_GetItemWithError(self->sticky, topic);
        if (s == NULL)
            return PyErr_Occurred() ? -1 : 0;
        p = small_int(s);
        if (p < 0 || p >= n)
            return 0;
        sticky = 1;
    } else {
        PyObject *c = PyObject_CallOneArg(self->crc32c, key);
        if (c == NULL)
            return -1;
        p = small_int(c);
        Py_DECREF(c);
        if (p < 0)
            return 0;
        p %= n;
    }
    long long reserve = PyBytes_GET_SIZE(value) + (key == Py_None ? 0 : PyBytes_GET_SIZE(key)) + self->slack;
    if (reserve + self->header_size > limit)
        return 0;
    long long ts = tsobj == Py_None ? now_ms() : small_int(tsobj);
    if (ts < 0)
        return 0;
    /* memory: used + reserve within the limit and nobody waiting */
    PyObject *o = PyObject_GetAttr(self->memory, str_waiters);
    if (o == NULL)
        return -1;
    int waiters = PyObject_IsTrue(o);
    Py_DECREF(o);
    if (waiters != 0)
        return waiters < 0 ? -1 : 0;
    PyObject *used_obj = PyObject_GetAttr(self->memory, str_used);
    if (used_obj == NULL)
        return -1;
    long long used = small_int(used_obj);
    Py_DECREF(used_obj);
    PyObject *limit_obj = PyObject_GetAttr(self->memory, str_limit);
    if (limit_obj == NULL)
        return -1;
    long long mlimit = small_int(limit_obj);
    Py_DECREF(limit_obj);
    if (used < 0 || used + reserve > mlimit)
        return 0;
    PyObject *pn = part != Py_None ? Py_NewRef(part) : PyLong_FromLongLong(p);
    PyObject *tp = pn == NULL ? NULL : PyTuple_Pack(2, topic, pn);
    Py_XDECREF(pn);
    if (tp == NULL)
        return -1;
    PyObject *batch = PyDict_GetItemWithError(self->open, tp); /* borrowed */
    Py_DECREF(tp);
    if (batch == NULL)
        return PyErr_Occurred() ? -1 : 0;
    if (!PyObject_TypeCheck(batch, &RecordBufferType))
        return 0;
    Py_INCREF(batch);
    int added = buffer_add((RecordBuffer *)batch, (Py_ssize_t)cap, key, value, Py_None, ts, sink, reserve);
    if (added <= 0) { /* full: the Python path closes it; or an error (nothing added) */
        Py_DECREF(batch);
        return added;
    }
    PyObject *new_used = PyLong_FromLongLong(used + reserve);
    if (new_used == NULL || PyObject_SetAttr(self->memory, str_used, new_used) < 0) {
        /* cannot happen short of running out of memory; the record stays buffered */
        Py_XDECREF(new_used);
        Py_DECREF(batch);
        return -1;
    }
    Py_DECREF(new_used);
    if (((RecordBuffer *)batch)->size >= cap) {
        PyObject *r = PyObject_CallFunction(self->on_full, "OiLL", batch, sticky, n, p);
        if (r == NULL) {
            Py_DECREF(batch);
            return -1;
        }
        Py_DECREF(r);
    }
    Py_DECREF(batch);
    return 1;
}

PyDoc_STRVAR(append_doc,
"append(topic, value, key, headers, partition, timestamp_ms, sink) -> bool\n\n"
"Buffer the record as Producer._append_now would, when it is the common case; False, having\n"
"changed nothing, when the Python path must take it.");

static PyObject *
Appender_append(Appender *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "append takes 7 arguments");
        return NULL;
    }
    int r = append_impl(self, args[0], args[1], args[2], args[3], args[4], args[5], args[6]);
    if (r < 0)
        return NULL;
    return PyBool_FromLong(r);
}

/* Producer.send (the Python function ``py_send``) called as the caller called ``send``. */
static PyObject *
send_in_python(Appender *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t n = PyVectorcall_NARGS(nargsf) + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
    PyObject *small[8], **all = n + 1 <= 8 ? small : PyMem_Malloc((size_t)(n + 1) * sizeof(PyObject *));
    if (all == NULL)
        return PyErr_NoMemory();
    all[0] = self->producer;
    memcpy(all + 1, args, (size_t)n * sizeof(PyObject *));
    PyObject *r = PyObject_Vectorcall(self->py_send, all, PyVectorcall_NARGS(nargsf) + 1, kwnames);
    if (all != small)
        PyMem_Free(all);
    return r;
}

/* Whether the producer takes sends now: not closing, not fenced.  -1 on error. */
static int
producer_open(Appender *self)
{
    PyObject *o = PyObject_GetAttr(self->producer, str_closing);
    if (o == NULL)
        return -1;
    int closing = PyObject_IsTrue(o);
    Py_DECREF(o);
    if (closing != 0)
        return closing < 0 ? -1 : 0;
    PyObject *sender = PyObject_GetAttr(self->producer, str_sender);
    if (sender == NULL)
        return -1;
    o = PyObject_GetAttr(sender, str_fenced);
    Py_DECREF(sender);
    if (o == NULL)
        return -1;
    int fenced = o != Py_None;
    Py_DECREF(o);
    return !fenced;
}

PyDoc_STRVAR(send_doc,
"send(topic, value, *, key=None, headers=None, partition=None, timestamp_ms=None)\n\n"
"Producer.send (see its documentation), with the common record buffered in C.");

static PyObject *
Appender_send(Appender *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 2)
        return send_in_python(self, args, nargsf, kwnames);
    PyObject *key = Py_None, *headers = Py_None, *part = Py_None, *ts = Py_None;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        if (name == str_key)
            key = args[2 + i];
        else if (name == str_headers)
            headers = args[2 + i];
        else if (name == str_partition)
            part = args[2 + i];
        else if (name == str_timestamp_ms)
            ts = args[2 + i];
        else /* a name not interned, or one send does not take: as Python would */
            return send_in_python(self, args, nargsf, kwnames);
    }
    PyObject *loop = PyObject_GetAttr(self->producer, str_loop);
    if (loop == NULL)
        return NULL;
    int open = loop == Py_None ? 0 : producer_open(self);
    if (open <= 0) { /* not started, closing or fenced: Python raises or fails the future */
        Py_DECREF(loop);
        return open < 0 ? NULL : send_in_python(self, args, nargsf, kwnames);
    }
    PyObject *fut = PyObject_CallMethodNoArgs(loop, str_create_future);
    PyObject *buffered = fut == NULL ? NULL : PyObject_CallMethodNoArgs(loop, str_create_future);
    Py_DECREF(loop);
    if (buffered == NULL) {
        Py_XDECREF(fut);
        return NULL;
    }
    PyObject *topic = args[0], *value = args[1], *r;
    int done = append_impl(self, topic, value, key, headers, part, ts, fut);
    if (done > 0) {
        r = PyObject_CallMethodOneArg(buffered, str_set_result, fut);
    } else if (done == 0) {
        PyObject *rest[9] = {self->producer, topic, value, key, headers, part, ts, fut, buffered};
        r = PyObject_VectorcallMethod(str_send_rest, rest, 9 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(fut);
        Py_DECREF(buffered);
        return r; /* the future _send_rest returns: buffered */
    } else if (PyErr_ExceptionMatches(PyExc_Exception)) { /* nothing was buffered: the future says why */
        PyObject *type, *exc, *tb;
        PyErr_Fetch(&type, &exc, &tb);
        PyErr_NormalizeException(&type, &exc, &tb);
        if (tb != NULL)
            PyException_SetTraceback(exc, tb);
        r = PyObject_CallMethodOneArg(buffered, str_set_exception, exc);
        Py_XDECREF(type);
        Py_XDECREF(exc);
        Py_XDECREF(tb);
    } else {
        r = NULL;
    }
    Py_DECREF(fut);
    if (r == NULL) {
        Py_DECREF(buffered);
        return NULL;
    }
    Py_DECREF(r);
    return buffered;
}

static PyMethodDef Appender_methods[] = {
    {"append", (PyCFunction)(void (*)(void))Appender_append, METH_FASTCALL, append_doc},
    {"send", (PyCFunction)(void (*)(void))Appender_send, METH_FASTCALL | METH_KEYWORDS, send_doc},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject AppenderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "sluice._crecords.Appender",
    .tp_doc = "Appender(producer, topics, routes, lanes, open, memory, sticky, crc32c, on_full, py_send, "
              "partitioner, header_size, slack): the producer's per-record path for the common record.",
    .tp_basicsize = sizeof(Appender),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = Appender_new,
    .tp_dealloc = (destructor)Appender_dealloc,
    .tp_traverse = (traverseproc)Appender_traverse,
    .tp_clear = (inquiry)Appender_clear,
    .tp_methods = Appender_methods,
};

static PyObject *
init(PyObject *self, PyObject *exc)
{
    Py_XSETREF(corrupt_record, Py_NewRef(exc));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode_body", (PyCFunction)(void (*)(void))decode_body, METH_FASTCALL, decode_body_doc},
    {"encode_keyless", (PyCFunction)(void (*)(void))encode_keyless, METH_FASTCALL, encode_keyless_doc},
    {"encode_record", (PyCFunction)(void (*)(void))encode_record, METH_FASTCALL, encode_record_doc},
    {"append_record", (PyCFunction)(void (*)(void))append_record, METH_FASTCALL, append_record_doc},
    {"init", init, METH_O, "init(CorruptRecord): the exception type to raise."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "sluice._crecords",
    "The compiled record codec used by sluice.protocol.records when it is built.", -1, methods,
};

/* Raised whenever a function's arguments or results change: records.py uses a build
 * only if it says the version records.py expects (an old build left in place by an
 * editable install falls back to pure Python instead of failing). */
#define ABI_VERSION 6

PyMODINIT_FUNC
PyInit__crecords(void)
{
    empty_tuple = PyTuple_New(0);
    if (empty_tuple == NULL)
        return NULL;
    str_done = PyUnicode_InternFromString("done");
    str_set_result = PyUnicode_InternFromString("set_result");
    str_used = PyUnicode_InternFromString("used");
    str_limit = PyUnicode_InternFromString("limit");
    str_waiters = PyUnicode_InternFromString("waiters");
    str_loop = PyUnicode_InternFromString("_loop");
    str_closing = PyUnicode_InternFromString("_closing");
    str_sender = PyUnicode_InternFromString("_sender");
    str_fenced = PyUnicode_InternFromString("fenced");
    str_create_future = PyUnicode_InternFromString("create_future");
    str_set_exception = PyUnicode_InternFromString("set_exception");
    str_send_rest = PyUnicode_InternFromString("_send_rest");
    str_key = PyUnicode_InternFromString("key");
    str_headers = PyUnicode_InternFromString("headers");
    str_partition = PyUnicode_InternFromString("partition");
    str_timestamp_ms = PyUnicode_InternFromString("timestamp_ms");
    if (!str_done || !str_set_result || !str_used || !str_limit || !str_waiters || !str_loop || !str_closing
        || !str_sender || !str_fenced || !str_create_future || !str_set_exception || !str_send_rest || !str_key
        || !str_headers || !str_partition || !str_timestamp_ms)
        return NULL;
    if (PyType_Ready(&RecordBufferType) < 0 || PyType_Ready(&AppenderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "ABI_VERSION", ABI_VERSION) < 0
        || PyModule_AddType(m, &RecordBufferType) < 0 || PyModule_AddType(m, &AppenderType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
