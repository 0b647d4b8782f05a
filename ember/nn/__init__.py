"""ember.nn"""
