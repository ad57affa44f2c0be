/* Field extractor for wide profiler CSV tables (npu_deploy.profiling.parse, private).
 *
 * npd_csv_scan() walks complete records of an RFC 4180 byte buffer (comma separator, '"' quoting with
 * "" as an escaped quote, LF or CRLF record ends, line breaks allowed inside quoted fields) and copies
 * only the fields whose column is marked in `keep` into `out`, each closed by 0x1F, plus one empty field
 * when `pad` is set: every record gives the same number of fields. Python then makes the records with
 * one str.split and zip, so the skipped columns never become Python objects.
 *
 * It handles only the plain case and stops *before* any record that is not plain, so that the caller
 * reads that one record with the csv module and gets exactly its result (the same row, the same error,
 * the same line count):
 *   - a field count other than `ncols`, a bare CR, a '"' inside an unquoted field, text after a closing
 *     quote, a quoted field still open at the end of the data;
 *   - a field of more than `max_field` bytes (the csv module's limit counts characters, never more than
 *     bytes, so a shorter field is always within it);
 *   - a NUL anywhere (older csv modules refuse it), a kept field holding 0x1E or 0x1F (they would
 *     break the split).
 * Blank lines (the csv module yields no row for them) are counted and passed over.
 *
 * Every read is bounded by `len`; every write by `out_cap` and `max_rows`. Nothing is allocated.
 *
 * state (in/out, int64[6]):
 *   [0] position of the next record (in: where to start; out: after the last record consumed)
 *   [1] lines consumed before that position (the csv module's line_num)
 *   [2] records written (out)
 *   [3] bytes written to out (out)
 *   [4] 1 while every record written is one line and they follow each other (no blank or multi-line
 *       record between them): then the line of record k is first_line + k (out)
 *   [5] line of the first record written (out)
 * Return: 0 all complete records consumed (more data needed, or the end reached when at_eof),
 *         1 the record at state[0] needs the csv module, 2 out or rows full.
 */
#include <stdint.h>
#include <string.h>

/* byte classes of an unquoted field: 0 plain, 1 separator, 2 LF, 3 CR, 4 quote, 5 NUL, 6 0x1E/0x1F.
   A constant table: ctypes releases the GIL, so two threads may scan at once (nothing is initialised
   lazily). */
static const unsigned char cls[256] = {
    [0] = 5, ['\n'] = 2, ['\r'] = 3, ['"'] = 4, [','] = 1, [0x1E] = 6, [0x1F] = 6,
};

/* First position at or after j whose byte is not plain (cls != 0), or len. Eight bytes at a time where
   the compiler says the machine is little-endian: every special byte is below 0x2D, and the lowest byte
   flagged by the "has a byte below n" word test is always a true one (the borrow only runs upward), so
   a flagged byte that is not special (a TAB, a space) is stepped over and the scan goes on. */
static inline int64_t scan_plain(const unsigned char *buf, int64_t j, int64_t len) {
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (j + 8 <= len) {
        uint64_t x;
        memcpy(&x, buf + j, 8);
        uint64_t t = (x - 0x2D2D2D2D2D2D2D2DULL) & ~x & 0x8080808080808080ULL;
        if (!t) { j += 8; continue; }
        j += __builtin_ctzll(t) >> 3;
        if (cls[buf[j]]) return j;
        j++;
    }
#endif
    while (j < len && cls[buf[j]] == 0) j++;
    return j;
}

int npd_csv_scan(const unsigned char *buf, int64_t len, int at_eof, int ncols, const unsigned char *keep,
                 int pad, int64_t max_field, unsigned char *out, int64_t out_cap, int64_t *line_of_row,
                 int64_t max_rows, int64_t *state) {
    int64_t pos = state[0], lines = state[1], rows = 0, o = 0;
    int consecutive = 1;
    int64_t first_line = 0;
    int status = 0;
    state[2] = state[3] = 0; state[4] = 1; state[5] = 0;   /* no stale output on any return */
    if (ncols <= 0 || pos < 0 || pos > len) return 1;
    int last_kept = -1;
    for (int c = 0; c < ncols; c++) if (keep[c]) last_kept = c;
    while (pos < len) {
        /* blank lines: no row */
        if (buf[pos] == '\n') { pos++; lines++; if (rows) consecutive = 0; continue; }
        if (buf[pos] == '\r') {
            if (pos + 1 >= len) { if (at_eof) { status = 1; } break; }
            if (buf[pos + 1] == '\n') { pos += 2; lines++; if (rows) consecutive = 0; continue; }
            status = 1; break;
        }
        if (rows >= max_rows) { status = 2; break; }
        int64_t p = pos, o0 = o, breaks = 0;
        int field = 0, done = 0, bad = 0, need_more = 0;
        while (!done) {
            if (field == last_kept + 1) {
                /* Only skipped columns are left (the PMU counters of a wide table): when the rest of the
                   line has no quote, CR or NUL and is not longer than one field may be, it is plain; just
                   count its separators (a loop the compiler vectorises). Otherwise field by field. */
                const unsigned char *nl = memchr(buf + p, '\n', (size_t)(len - p));
                if (nl) {
                    int64_t e = (int64_t)(nl - buf), end = e;
                    if (end > p && buf[end - 1] == '\r') end--;
                    if (end - p <= max_field) {
                        int64_t commas = 0;
                        unsigned odd = 0;
                        for (int64_t j = p; j < end; j++) {
                            unsigned char c = buf[j];
                            commas += c == ',';
                            odd |= (unsigned)(c == '"') | (unsigned)(c == '\r') | (unsigned)(c == 0);
                        }
                        if (!odd) {
                            if (commas != ncols - field - 1) bad = 1;
                            field = ncols;
                            p = e + 1;
                            break;
                        }
                    }
                }
            }
            int k = keep[field];
            int64_t fstart = p;
            if (p < len && buf[p] == '"') {
                p++;
                for (;;) {
                    const unsigned char *q = memchr(buf + p, '"', (size_t)(len - p));
                    int64_t end = q ? (int64_t)(q - buf) : len;
                    /* line breaks and forbidden bytes inside the quoted run */
                    for (int64_t j = p; j < end; j++) {
                        unsigned char c = buf[j];
                        if (c == '\n') breaks++;
                        else if (c == '\r') { if (j + 1 < len && buf[j + 1] != '\n') breaks++;
                                              else if (j + 1 >= len) { need_more = 1; } }
                        else if (c == 0 || (k && (c == 0x1E || c == 0x1F))) bad = 1;
                    }
                    if (k && !bad) {
                        if (o + (end - p) + 2 > out_cap) { status = 2; break; }
                        memcpy(out + o, buf + p, (size_t)(end - p));
                        o += end - p;
                    }
                    if (!q) { if (len - fstart > max_field) bad = 1; else need_more = 1; break; }
                    p = end + 1;
                    if (p < len && buf[p] == '"') {        /* "" inside quotes: one quote */
                        if (k && !bad) { if (o + 3 > out_cap) { status = 2; break; } out[o++] = '"'; }
                        p++;
                        continue;
                    }
                    if (p >= len) { need_more = 1; }
                    break;
                }
                if (status == 2) break;
                if (need_more) {
                    if (at_eof) bad = 1;   /* quote open, or a CR, at the very end: the csv module decides */
                    break;
                }
                if (bad || p - fstart > max_field) { bad = 1; break; }
                /* after the closing quote: a separator or the end of the record, nothing else */
                unsigned char c = buf[p];
                if (c == ',') { p++; }
                else if (c == '\n') { p++; done = 1; }
                else if (c == '\r') {
                    if (p + 1 >= len) { need_more = 1; if (at_eof) bad = 1; break; }
                    if (buf[p + 1] != '\n') { bad = 1; break; }
                    p += 2; done = 1;
                }
                else { bad = 1; break; }
            } else {
                int64_t j = p;
                for (;;) {
                    j = scan_plain(buf, j, len);
                    if (j < len && cls[buf[j]] == 6 && !k) { j++; continue; }  /* 0x1E/0x1F, skipped field */
                    break;
                }
                if (j - p > max_field) { bad = 1; break; }
                if (j >= len) {
                    if (!at_eof) { need_more = 1; break; }
                    done = 2;                       /* the last record, no line end */
                } else {
                    unsigned char c = cls[buf[j]];
                    if (c >= 4) { bad = 1; break; }    /* quote, NUL, 0x1E/0x1F in a kept field */
                }
                if (k) {
                    if (o + (j - p) + 2 > out_cap) { status = 2; break; }
                    memcpy(out + o, buf + p, (size_t)(j - p));
                    o += j - p;
                }
                p = j;
                if (done == 2) { done = 1; }
                else {
                    unsigned char c = buf[p];
                    if (c == ',') p++;
                    else if (c == '\n') { p++; done = 1; }
                    else {                                      /* CR */
                        if (p + 1 >= len) { need_more = 1; if (at_eof) bad = 1; break; }
                        if (buf[p + 1] != '\n') { bad = 1; break; }
                        p += 2; done = 1;
                    }
                }
            }
            if (bad) break;
            if (k) { if (o + 2 > out_cap) { status = 2; break; } out[o++] = 0x1F; }
            field++;
            if (!done && field >= ncols) { bad = 1; break; }   /* too many fields */
        }
        if (status == 2) { o = o0; break; }
        if (need_more && !bad) { o = o0; break; }
        if (bad || field != ncols) { o = o0; status = 1; break; }
        /* every kept field is closed by 0x1F; so is the empty pad field */
        if (pad) {
            if (o + 1 > out_cap) { o = o0; status = 2; break; }
            out[o++] = 0x1F;
        }
        lines += 1 + breaks;
        if (rows == 0) first_line = lines;
        if (breaks) consecutive = 0;
        line_of_row[rows++] = lines;
        pos = p;
    }
    state[0] = pos;
    state[1] = lines;
    state[2] = rows;
    state[3] = o;
    state[4] = consecutive;
    state[5] = first_line;
    return status;
}
