// Package webhook is the HTTP webhook transport: it POSTs each delivery to its webhook in
// CloudEvents' binary mode (http.go), signs it as Standard Webhooks says when the webhook has
// a signing secret and sends its bearer token, both read again after a 401 (signing.go), and
// reads the answer (classify.go): 2xx delivered; 408, 429 and 5xx retried, after Retry-After
// when given; any other answer final. Queues, retries and dead letters are package delivery's.
//
// Concurrency: Send is called by a sink's workers at once, for different objects; the
// credentials are swapped atomically when their files change.
package webhook
