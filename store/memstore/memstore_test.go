package memstore_test

import (
	"testing"

	"github.com/greendot/greendot/store"
	"github.com/greendot/greendot/store/memstore"
	"github.com/greendot/greendot/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, cfg storetest.Config) store.Store {
		s, err := memstore.New(memstore.Config{TTL: cfg.TTL, Grace: cfg.Grace})
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}
