/* The compiled half of protocol/records.py: decode a batch body into Record objects and
 * encode records, byte for byte as the pure-Python functions of protocol/records_py.py do.
 * With _cproducer.c, the module sluice._crecords.
 *
 * protocol/records_py.py stays the reference: records.py uses these functions when this
 * module was built (``pip install`` compiles it; a machine without a C compiler skips it)
 * and the tests compare the two on random batches.  Errors are raised as the ``CorruptRecord`` given to
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

#include "_crecords.h"

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
"checked, kept or not.  Raises CorruptRecord as records_py.decode_body does.");

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

PyDoc_STRVAR(check_body_doc,
"check_body(body, count)\n\n"
"Check, without building a record, that an uncompressed batch body holds exactly\n"
"``count`` well-formed records whose offset deltas are 0, 1, ... ``count`` - 1 and whose\n"
"header keys are UTF-8: what a consumer's decode_body would refuse, the broker refuses\n"
"before storing.  Raises CorruptRecord.");

/* A varint of the record being checked, bounded by its end ``lim``. */
#define CHECK_VARINT(var)                                                       \
    do {                                                                        \
        int st_ = read_varint(p, lim, &pos, &(var));                            \
        if (st_ == -1)                                                          \
            goto truncated;                                                     \
        if (st_ == -2) {                                                        \
            corrupt("varint overflows 64 bits");                                \
            goto fail;                                                          \
        }                                                                       \
    } while (0)

/* Skip a key's or value's bytes: -1 (None) only in its one-byte form, as read_nullable. */
#define SKIP_NULLABLE(what)                                                     \
    do {                                                                        \
        if (pos < lim && p[pos] == 1) {                                         \
            pos += 1;                                                           \
            break;                                                              \
        }                                                                       \
        int64_t len_;                                                           \
        CHECK_VARINT(len_);                                                     \
        if (len_ < 0) {                                                         \
            corrupt("bad %s length %lld", what, (long long)len_);               \
            goto fail;                                                          \
        }                                                                       \
        if (len_ > lim - pos)                                                   \
            goto truncated;                                                     \
        pos += (Py_ssize_t)len_;                                                \
    } while (0)

static PyObject *
check_body(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "check_body takes 2 arguments");
        return NULL;
    }
    Py_ssize_t count = PyLong_AsSsize_t(args[1]);
    if (count == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    const uint8_t *p = (const uint8_t *)view.buf;
    Py_ssize_t pos = 0, end = view.len, lim = end;
    int64_t length, ts_delta, off_delta, hcount, klen, vlen;

    for (Py_ssize_t n = 0; n < count; n++) {
        lim = end;
        CHECK_VARINT(length);
        if (length < 0 || length > end - pos) {
            corrupt("record length runs past its batch");
            goto fail;
        }
        lim = pos + (Py_ssize_t)length; /* every field inside the record */
        if (pos >= lim)
            goto truncated;
        pos += 1; /* attributes */
        CHECK_VARINT(ts_delta);
        CHECK_VARINT(off_delta);
        if (off_delta != n) {
            corrupt("record %zd of a batch has offset delta %lld", n, (long long)off_delta);
            goto fail;
        }
        SKIP_NULLABLE("key");
        SKIP_NULLABLE("value");
        CHECK_VARINT(hcount);
        if (hcount < 0 || hcount > lim - pos) {
            corrupt("bad header count %lld", (long long)hcount);
            goto fail;
        }
        for (int64_t i = 0; i < hcount; i++) {
            CHECK_VARINT(klen);
            if (klen < 0) {
                corrupt("null header key");
                goto fail;
            }
            if (klen > lim - pos)
                goto truncated;
            for (Py_ssize_t j = pos; j < pos + (Py_ssize_t)klen; j++) {
                if (p[j] >= 0x80) { /* not ASCII: let the decoder judge */
                    PyObject *key = PyUnicode_DecodeUTF8((const char *)p + pos, (Py_ssize_t)klen, NULL);
                    if (key == NULL) {
                        if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                            PyErr_Clear();
                            corrupt("header key is not UTF-8");
                        }
                        goto fail;
                    }
                    Py_DECREF(key);
                    break;
                }
            }
            pos += (Py_ssize_t)klen;
            CHECK_VARINT(vlen);
            if (vlen > lim - pos)
                goto truncated;
            if (vlen > 0)
                pos += (Py_ssize_t)vlen;
        }
        if (pos != lim) {
            corrupt("record fields take %zd of its %lld bytes", pos - lim + (Py_ssize_t)length, (long long)length);
            goto fail;
        }
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
Py_ssize_t
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

static PyObject *
init(PyObject *self, PyObject *exc)
{
    Py_XSETREF(corrupt_record, Py_NewRef(exc));
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"decode_body", (PyCFunction)(void (*)(void))decode_body, METH_FASTCALL, decode_body_doc},
    {"check_body", (PyCFunction)(void (*)(void))check_body, METH_FASTCALL, check_body_doc},
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
#define ABI_VERSION 12

PyMODINIT_FUNC
PyInit__crecords(void)
{
    empty_tuple = PyTuple_New(0);
    if (empty_tuple == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "ABI_VERSION", ABI_VERSION) < 0 || add_producer_types(m) < 0
        || add_future_type(m) < 0 || add_outbox_type(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
