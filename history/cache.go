package history

import (
	"container/list"
	"sync"
)

// cacheBytes bounds the blocks the reads of every history keep decoded between them. A page of a
// list at a past resourceVersion reads about thirty blocks of 32 KiB; asked again (the next
// reader of the same past, a client polling it, the revisions of the same objects) it decodes
// none. A block is about 25 µs to decode.
const cacheBytes = 8 << 20

// blockCache holds decoded blocks, the most recently used kept up to a number of bytes. A block
// once written never changes, so what it holds is never stale; a block of a segment dropped since
// is never asked for again and ages out. The buffers of the blocks it holds are never reused:
// a read may still hold one it evicted.
type blockCache struct {
	mu    sync.Mutex
	max   int
	bytes int
	lru   *list.List // of *cachedBlock, the most recent first
	m     map[cacheKey]*list.Element
}

// cacheKey names a block: its log, its segment and its place there.
type cacheKey struct {
	log *Log
	seg uint64
	blk uint32
}

type cachedBlock struct {
	key cacheKey
	d   *decoded
}

func newBlockCache(maxBytes int) *blockCache {
	return &blockCache{max: maxBytes, lru: list.New(), m: map[cacheKey]*list.Element{}}
}

// get is the block of k, when held.
func (c *blockCache) get(k cacheKey) (*decoded, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[k]
	if !ok {
		return nil, false
	}
	c.lru.MoveToFront(e)
	return e.Value.(*cachedBlock).d, true
}

// add holds d as the block of k, evicting the least recently used past the bound. A block larger
// than a quarter of the bound is not held.
func (c *blockCache) add(k cacheKey, d *decoded) {
	size := cap(*d.raw) + 4*cap(d.offs)
	if size > c.max/4 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[k]; ok {
		return // another read decoded it meanwhile
	}
	c.m[k] = c.lru.PushFront(&cachedBlock{key: k, d: d})
	c.bytes += size
	for c.bytes > c.max {
		c.remove(c.lru.Back())
	}
}

func (c *blockCache) remove(e *list.Element) {
	b := c.lru.Remove(e).(*cachedBlock)
	delete(c.m, b.key)
	c.bytes -= cap(*b.d.raw) + 4*cap(b.d.offs)
}

// forget drops the blocks of l: it is closed.
func (c *blockCache) forget(l *Log) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for e := c.lru.Front(); e != nil; {
		next := e.Next()
		if e.Value.(*cachedBlock).key.log == l {
			c.remove(e)
		}
		e = next
	}
}
