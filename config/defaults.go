package config

import (
	"time"

	"github.com/spf13/viper"
)

// This file sets every default: the settings outside lists on viper before the file is
// decoded (setDefaults), and the values inside lists on the decoded tree (setListDefaults).
// The default values themselves are the Default constants beside their settings.

// setDefaults sets the defaults of the settings outside lists (the api block's in
// setAPIDefaults) on the viper instance, before the file is decoded. Values inside lists,
// which viper cannot default, are defaulted on the decoded tree by setListDefaults, through
// each kind of entry's own setDefaults (Sink's, JetStream's, Kafka's).
func setDefaults(v *viper.Viper) {
	setAPIDefaults(v.SetDefault)
	v.SetDefault("metrics.address", ":9090")
	v.SetDefault("metrics.pprof", false)
	v.SetDefault("discovery.interval", "5s")
	v.SetDefault("client.cbor", true)
	v.SetDefault("client.http2", false)
	for name, l := range map[string]RateLimit{"informers": {50, 100}, "leaderElection": {10, 20}, "reviews": {20, 40}, "accessReviews": {20, 40}, "reads": {20, 40}} {
		v.SetDefault("client.rateLimits."+name+".qps", l.QPS)
		v.SetDefault("client.rateLimits."+name+".burst", l.Burst)
	}
	v.SetDefault("state.maxPendingBytes", DefaultMaxPendingBytes)
	v.SetDefault("log.level", "info")
	v.SetDefault("log.format", "json")
	v.SetDefault("shutdownTimeout", DefaultShutdownTimeout.String())
	v.SetDefault("consistencyCheck.enabled", true)
	v.SetDefault("consistencyCheck.period", DefaultConsistencyCheckPeriod.String())
	v.SetDefault("leaderElection.enabled", false)
	v.SetDefault("leaderElection.namespace", "")
	v.SetDefault("leaderElection.leaseName", "dynwatch")
	v.SetDefault("leaderElection.checkpointName", "dynwatch-checkpoints")
	v.SetDefault("leaderElection.identity", "")
	v.SetDefault("leaderElection.leaseDuration", "15s")
	v.SetDefault("leaderElection.renewDeadline", "10s")
	v.SetDefault("leaderElection.retryPeriod", "2s")
	v.SetDefault("leaderElection.checkpointInterval", "1s")
	v.SetDefault("cluster.id", "")
	v.SetDefault("cluster.name", "")
	v.SetDefault("cluster.inKeys", true)
	v.SetDefault("subscriptions.enabled", false)
	v.SetDefault("subscriptions.reviewEvery", DefaultReviewEvery.String())
	v.SetDefault("subscriptions.namespaces", []string{})
	v.SetDefault("subscriptions.quota.perNamespace", DefaultQuotaPerNamespace)
	v.SetDefault("subscriptions.signingSecretNames", []string{"dynwatch-signing"})
	v.SetDefault("subscriptions.credentialSecretNames", []string{"dynwatch-credentials"})
	v.SetDefault("subscriptions.quota.queueSize", DefaultQuotaQueueSize)
	v.SetDefault("subscriptions.quota.deliveriesPerSecond", DefaultQuotaDeliveriesSec)
}

func (c *Config) setListDefaults() {
	for _, s := range c.Sinks() {
		if sh := s.Shared(); sh.QueueSize == 0 && c.State.Path != "" {
			sh.QueueSize = DefaultQueueSizeWithState
		}
		s.setDefaults()
	}
	yes := true
	for i := range c.Resources {
		if c.Resources[i].StaleAfter == 0 {
			c.Resources[i].StaleAfter = DefaultStaleAfter
		}
		if h := &c.Resources[i].History; h.Retain > 0 && h.MaxBytes == 0 {
			h.MaxBytes = DefaultHistoryMaxBytes
		}
		if c.Resources[i].Cache == "" {
			c.Resources[i].Cache = CacheFull
		}
		t := &c.Resources[i].Transform
		if t.StripManagedFields == nil {
			t.StripManagedFields = &yes
		}
		if t.StripLastAppliedConfiguration == nil {
			t.StripLastAppliedConfiguration = &yes
		}
	}
}

func setAPIDefaults(set func(key string, value any)) {
	set("api.address", ":8443")
	set("api.maxPageSize", 500)
	set("api.watchHistory", 1000)
	set("api.requestTimeout", "60s")
	set("api.maxWatchTimeout", "30m")
	set("api.fieldSelectors", string(FieldSelectorsStrict))
	set("api.events", string(EventsFromAPIServer))
	set("api.auth.mode", string(AuthKubernetes))
	set("api.auth.allowNoneOnNetwork", false)
	set("api.auth.clientCAFile", "")
	set("api.auth.tokenCacheTTL", "10s")
	set("api.auth.allowCacheTTL", "10s")
	set("api.auth.denyCacheTTL", "10s")
	set("api.tls.enabled", true)
	set("api.tls.certFile", "")
	set("api.tls.keyFile", "")
	set("api.tls.selfSignedHosts", []string{})
	set("api.tls.selfSignedCAFile", "")
	set("api.limits.maxURLLength", 8192)
	set("api.limits.maxInFlight", 400)
	set("api.limits.maxInFlightPerUser", 100)
	set("api.limits.maxWatches", 2000)
	set("api.limits.maxWatchesPerUser", 200)
	set("api.limits.maxAuthenticating", 32)
	set("api.limits.maxAuthorizing", 32)
}

func (w *Sink) setDefaults() {
	if w.FilterErrors == "" {
		w.FilterErrors = FilterErrorsDeadLetter
	}
	if w.Payload.Diff == "" {
		w.Payload.Diff = DiffNone
	}
	if w.Payload.Object == "" {
		w.Payload.Object = PayloadFull
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&w.Timeout, DefaultWebhookTimeout)
	def(&w.Retry.InitialBackoff, DefaultInitialBackoff)
	def(&w.Retry.MaxBackoff, DefaultMaxBackoff)
	def(&w.Retry.MaxElapsed, DefaultMaxElapsed)
	if w.Workers == 0 {
		w.Workers = DefaultWebhookWorkers
	}
	if w.QueueSize == 0 {
		w.QueueSize = DefaultQueueSize
	}
}

func (js *JetStream) setDefaults() {
	js.Sink.setDefaults()
	js.Durability.setDefaults()
	if js.SubjectPrefix == "" {
		js.SubjectPrefix = DefaultSubjectPrefix
	}
}

func (k *Kafka) setDefaults() {
	k.Sink.setDefaults()
	k.Durability.setDefaults()
	if k.Compression == "" {
		k.Compression = CompressionNone
	}
	if k.Acks == "" {
		k.Acks = AcksAll
	}
	if k.Idempotent == nil {
		yes := true
		k.Idempotent = &yes
	}
}
